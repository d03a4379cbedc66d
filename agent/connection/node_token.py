"""The node token: issued by the server in `welcome` after a join, kept in the state
dir (mode 600) and used instead of the join token from then on."""

import os

NODE_TOKEN_FILE = "node_token"


def read_node_token(state_dir):
    """The stored node token, or None if there is none yet."""
    try:
        with open(os.path.join(state_dir, NODE_TOKEN_FILE)) as f:
            return f.read().strip() or None
    except FileNotFoundError:
        return None


def save_node_token(state_dir, token):
    """Write the token readable by its owner only, replacing any earlier one whole (a
    crash mid-write leaves the old token, never half a new one)."""
    path = os.path.join(state_dir, NODE_TOKEN_FILE)
    partial = path + ".partial"
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, token.encode() + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(partial, path)
