"""The demo's notification receiver: what a team's automation would run behind a signed
webhook. It listens on loopback, verifies each request with the channel's signing key (the
standardwebhooks library, as any receiver should), and appends what it got to a log file,
printing one line per message.

    python scripts/demo_receiver.py --port 8025 --key-file var/demo-receiver/signing.key \
        --log var/notifications.log

`make demo` runs it; `make demo` seeds the channel "demo receiver" that posts to it.
"""

import argparse
import json
import sys
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from standardwebhooks import Webhook, WebhookVerificationError


def handler_for(key_file, log_path):
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            try:
                payload = Webhook(Path(key_file).read_text().strip()).verify(body, self.headers)
            except (WebhookVerificationError, OSError, ValueError) as exc:
                self.send_response(401)
                self.end_headers()
                print(f"demo receiver: refused a request ({exc})", flush=True)
                return
            self.send_response(204)
            self.end_headers()
            data = payload.get("data", {})
            alerts = data.get("firing", []) + data.get("resolved", [])
            at = datetime.now(timezone.utc).isoformat(timespec="seconds")
            with open(log_path, "a") as log:
                log.write(f"{at} {payload['type']} {data.get('group', '')} (verified)\n")
                for alert in alerts:
                    log.write(f"    {alert['status']}: {alert['summary']}  {alert['url']}\n")
                log.write(json.dumps(payload) + "\n\n")
            print(f"demo receiver: {payload['type']} {data.get('group', '')}: "
                  f"{len(alerts)} alert(s), logged to {log_path}", flush=True)

        def log_message(self, *args):
            pass

    return Handler


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8025)
    parser.add_argument("--key-file", required=True)
    parser.add_argument("--log", required=True)
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", args.port), handler_for(args.key_file, args.log))
    print(f"demo receiver: listening on http://127.0.0.1:{args.port}/, logging to {args.log}",
          flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
