from django.core.management.base import BaseCommand, CommandError

from clusters.secret_store import SecretsUnavailable, rotate_all


class Command(BaseCommand):
    help = ("Re-encrypt every secret under the first key of CLUSTERUI_SECRETS_KEYS (after a new "
            "key was put first; the old one may be dropped afterwards).")

    def handle(self, *args, **options):
        try:
            count = rotate_all()
        except SecretsUnavailable as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"{count} secret{'s' if count != 1 else ''} re-encrypted")
