from __future__ import annotations

import getpass
import os

from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = ("Create a user who can log in (not an admin). The password comes from STUDIO_USER_PASSWORD, "
            "or is asked for twice on a terminal.")

    def add_arguments(self, parser) -> None:
        parser.add_argument("username")
        parser.add_argument("--email", default="")

    def handle(self, *args, **opts) -> None:
        User = get_user_model()
        username = opts["username"]
        field = User._meta.get_field(User.USERNAME_FIELD)
        try:
            field.run_validators(username)
        except ValidationError as exc:
            raise CommandError(f"{username!r} is not a username: {' '.join(exc.messages)}") from exc
        if not username or len(username) > field.max_length:
            raise CommandError(f"a username has 1 to {field.max_length} characters")
        if User.objects.filter(username=username).exists():
            raise CommandError(f"a user named {username!r} exists already")
        password = os.environ.get("STUDIO_USER_PASSWORD") or self.ask_password()
        user = User(username=username, email=opts["email"])
        try:
            validate_password(password, user)
        except ValidationError as exc:
            raise CommandError(f"that password will not do: {' '.join(exc.messages)}") from exc
        user.set_password(password)
        user.save()
        self.stdout.write(f"user {username} created: add them to a project with createproject --owner {username}, or as a member in the admin console")

    def ask_password(self) -> str:
        if not os.isatty(0):
            raise CommandError("set STUDIO_USER_PASSWORD, or run this on a terminal to type the password")
        first, second = getpass.getpass("Password: "), getpass.getpass("Password (again): ")
        if first != second:
            raise CommandError("the two passwords differ")
        return first
