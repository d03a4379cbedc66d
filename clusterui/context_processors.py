from clusters.models import Cluster
from clusters.roles import Role, role_of


def console(request):
    """What the base layout needs on every page: the cluster switcher and the user's role
    (`user_role`: a page's own context may name a node's `role`)."""
    if not getattr(request, "user", None) or not request.user.is_authenticated:
        return {}
    role = role_of(request.user)
    return {
        "all_clusters": Cluster.objects.only("name", "slug"),
        "user_role": role,
        "is_operator": role is not None and role >= Role.OPERATOR,
        "is_admin": role is not None and role >= Role.ADMIN,
    }
