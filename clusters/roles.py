"""The three roles, their permissions, and the one helper views use to require a role.

Roles are Django groups. viewer reads everything; operator also acts on nodes and
repairs; admin also changes settings. The sign-in issue maps IdP groups onto them.
"""

import enum
from functools import wraps

from django.core.exceptions import PermissionDenied


class Role(enum.IntEnum):
    VIEWER = 1
    OPERATOR = 2
    ADMIN = 3

    @property
    def group_name(self):
        return self.name.lower()

    @property
    def label(self):
        return self.name.lower()


# What each role may do, beyond the roles below it.
ROLE_PERMISSIONS = {
    Role.VIEWER: [
        "clusterui.view_cluster",
        "nodes.view_node",
        "nodes.view_gpu",
        "nodes.view_nodetransition",
        "healthchecks.view_healthevent",
    ],
    Role.OPERATOR: ["clusterui.operate_cluster"],
    Role.ADMIN: [
        "clusterui.administer_cluster",
        "clusterui.add_cluster",
        "clusterui.change_cluster",
        "clusterui.view_auditentry",
    ],
}


def permissions_of(role):
    return [perm for r in Role if r <= role for perm in ROLE_PERMISSIONS[r]]


def role_of(user):
    """The user's highest role, or None for a signed-in user without one."""
    if not user.is_authenticated or not user.is_active:
        return None
    if user.is_superuser:
        return Role.ADMIN
    cached = getattr(user, "_clusterui_role", False)
    if cached is not False:
        return cached
    names = set(user.groups.values_list("name", flat=True))
    held = [r for r in Role if r.group_name in names]
    user._clusterui_role = max(held) if held else None
    return user._clusterui_role


def has_role(user, role):
    held = role_of(user)
    return held is not None and held >= role


def require_role(role):
    """View decorator: 403 unless the signed-in user holds `role` or a higher one."""

    def decorator(view):
        @wraps(view)
        def wrapper(request, *args, **kwargs):
            if not has_role(request.user, role):
                raise PermissionDenied(f"This needs the {role.label} role.")
            return view(request, *args, **kwargs)

        return wrapper

    return decorator


def assign_role(user, role):
    """Make `role` the user's only clusterui role."""
    from django.contrib.auth.models import Group

    user.groups.remove(*Group.objects.filter(name__in=[r.group_name for r in Role]))
    if role is not None:
        user.groups.add(Group.objects.get(name=role.group_name))
    user.__dict__.pop("_clusterui_role", None)


def ensure_role_groups(**kwargs):
    """Create the three groups with exactly their permissions (post_migrate)."""
    from django.contrib.auth.models import Group, Permission

    for role in Role:
        group, _ = Group.objects.get_or_create(name=role.group_name)
        wanted = []
        for dotted in permissions_of(role):
            app_label, codename = dotted.split(".")
            perm = Permission.objects.filter(
                content_type__app_label=app_label, codename=codename
            ).first()
            if perm is not None:
                wanted.append(perm)
        group.permissions.set(wanted)
