"""The API tokens page: each person makes and revokes their own tokens (shown once); admins
see and revoke everyone's."""

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from clusters.roles import Role, has_role, require_role

from .forms import ApiTokenForm
from .models import ApiToken
from .tokens import do_create_api_token, do_revoke_api_token


def _tokens_for(user):
    tokens = ApiToken.objects.select_related("user")
    return tokens if has_role(user, Role.ADMIN) else tokens.filter(user=user)


@require_http_methods(["GET", "POST"])
@require_role(Role.VIEWER)
def token_list(request):
    form = ApiTokenForm(request.POST or None)
    created = None
    if request.method == "POST" and form.is_valid():
        token, plaintext = do_create_api_token(
            request.user, name=form.cleaned_data["name"],
            expires_in_days=form.cleaned_data["expires_in_days"], request=request)
        created = {"token": token, "plaintext": plaintext}
        form = ApiTokenForm()
    return render(request, "api/tokens.html",
                  {"form": form, "created": created, "tokens": _tokens_for(request.user)},
                  status=400 if form.errors else 200)


@require_POST
@require_role(Role.VIEWER)
def token_revoke(request, prefix):
    token = get_object_or_404(ApiToken.objects.select_related("user"), prefix=prefix)
    if token.user_id != request.user.pk and not has_role(request.user, Role.ADMIN):
        raise PermissionDenied("Only its owner or an admin revokes a token.")
    if do_revoke_api_token(token, actor=request.user, request=request):
        messages.success(request, f"Token {token.prefix}… ({token.name}) revoked.")
    else:
        messages.info(request, f"Token {token.prefix}… was already revoked.")
    return redirect("api_tokens")
