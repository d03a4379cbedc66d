"""Signing in and out: /accounts/login/ (the provider when OpenID Connect is on, else the
local form), the break-glass sign-in for local admins, sign-out, and the pages that say a
sign-in failed or that the user signed out. Every sign-in and sign-out is audited."""

from urllib.parse import urlencode

from django import forms
from django.conf import settings
from django.contrib import auth
from django.contrib.auth import REDIRECT_FIELD_NAME, get_user_model
from django.contrib.auth import views as auth_views
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.decorators import login_not_required
from django.http import Http404, HttpRequest
from django.shortcuts import redirect, render, resolve_url
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from common.redirects import safe_next

from .oidc import FAILURE_SESSION_KEY, mapped_groups_by_role, provider_logout_url
from .roles import Role, has_role
from .services import client_ip, record_audit
from .sign_in_limits import (
    Lockout,
    forget_failed_sign_ins,
    lockout,
    record_failed_sign_in,
)

MODEL_BACKEND = "django.contrib.auth.backends.ModelBackend"


def sign_in_next(request):
    """The page to go to after signing in, when it is this site's; else ""."""
    wanted = request.POST.get(REDIRECT_FIELD_NAME) or request.GET.get(REDIRECT_FIELD_NAME, "")
    return safe_next(request, wanted)


def refuse_password(request, action, username, reason):
    """A password was looked at and refused: count it (sign_in_limits) and audit it; when it
    locks the address out, audit the lockout too, once (attempts while locked write nothing)."""
    locked = record_failed_sign_in(username, client_ip(request))
    record_audit(None, action, sign_in_object(username), request=request,
                 changes={"method": "password", "outcome": "refused", "reason": reason,
                          "username": username})
    if locked is not None:
        record_audit(None, "user.sign_in_locked_out", sign_in_object(username), request=request,
                     changes={"username": username, "reason": locked.reason,
                              "until": locked.until.isoformat(), "form": action})


def sign_in_object(username):
    """What a sign-in's audit row is about: the account, or the name tried when none has it."""
    return get_user_model().objects.filter(username=username).first() or get_user_model()(
        username=username)


class LocalSignInView(auth_views.LoginView):
    """Django's sign-in form for local accounts (OpenID Connect off), audited and limited
    (clusters/sign_in_limits.py)."""

    redirect_authenticated_user = True

    def post(self, request, *args, **kwargs):
        username = request.POST.get("username", "")
        locked = lockout(username, client_ip(request))
        if locked is None:
            return super().post(request, *args, **kwargs)
        form = self.get_form()
        form.add_error(None, locked.message)
        return self.render_to_response(self.get_context_data(form=form), status=429)

    def form_valid(self, form):
        response = super().form_valid(form)
        user = form.get_user()
        forget_failed_sign_ins(user.get_username(), client_ip(self.request))
        record_audit(user, "user.sign_in", user, request=self.request,
                     changes={"method": "password"})
        return response

    def form_invalid(self, form):
        username = form.data.get("username", "")
        if username:
            refuse_password(self.request, "user.sign_in_refused", username,
                            "wrong user name or password")
        return super().form_invalid(form)


local_sign_in = LocalSignInView.as_view()


@login_not_required
@require_http_methods(["GET", "POST"])
def sign_in(request):
    """With OpenID Connect on, the provider signs people in; else the local form."""
    if not settings.CLUSTERUI_OIDC_ENABLED:
        return local_sign_in(request)
    next_url = sign_in_next(request)
    if request.user.is_authenticated:
        return redirect(next_url or settings.LOGIN_REDIRECT_URL)
    query = f"?{urlencode({REDIRECT_FIELD_NAME: next_url})}" if next_url else ""
    return redirect(reverse("oidc_authentication_init") + query)


@require_POST
def sign_out(request):
    """End the session here and, with OpenID Connect, at the provider too."""
    user = request.user
    if settings.CLUSTERUI_OIDC_ENABLED:
        destination = provider_logout_url(request)
    else:
        destination = resolve_url(settings.LOGOUT_REDIRECT_URL)
    if user.is_authenticated:  # always, but for a session that ends as this request runs
        at_provider = bool(settings.CLUSTERUI_OIDC_ENABLED
                           and settings.CLUSTERUI_OIDC_END_SESSION_ENDPOINT
                           and request.session.get("oidc_id_token"))
        record_audit(user, "user.sign_out", user, request=request,
                     changes={"issuer": settings.CLUSTERUI_OIDC_ISSUER or None,
                              "at_provider": at_provider})
        auth.logout(request)
    return redirect(destination)


@login_not_required
@require_GET
def signed_out(request):
    at_provider = settings.CLUSTERUI_OIDC_ENABLED and bool(
        settings.CLUSTERUI_OIDC_END_SESSION_ENDPOINT)
    return render(request, "registration/signed_out.html", {"at_provider": at_provider})


@login_not_required
@require_GET
def sign_in_failed(request):
    failure = request.session.get(FAILURE_SESSION_KEY)
    if failure is None:
        return redirect(settings.LOGIN_URL)
    context = {"failure": failure, "groups_claim": settings.CLUSTERUI_OIDC_GROUPS_CLAIM,
               "mapped": mapped_groups_by_role()}
    return render(request, "registration/sign_in_failed.html", context, status=403)


class BreakGlassForm(forms.Form):
    username = forms.CharField(label="User name", max_length=150)
    password = forms.CharField(label="Password", strip=False, widget=forms.PasswordInput)


def do_break_glass_sign_in(request: HttpRequest, username,
                           password) -> tuple[AbstractBaseUser | None, Lockout | None]:
    """Sign a local admin account in with its password, auditing the attempt whatever its
    outcome. Returns (the user, None); or (None, the Lockout) when the attempt was not looked
    at, and (None, None) when it was refused (the audit entry says why)."""
    locked = lockout(username, client_ip(request))
    if locked is not None:
        return None, locked
    account = get_user_model().objects.filter(username=username).first()
    user = ModelBackend().authenticate(request, username=username, password=password)
    if account is None:
        reason = "no such local account"
    elif not account.has_usable_password():
        reason = "no local password (signs in through the identity provider)"
    elif not account.is_active:
        reason = "account disabled"
    elif user is None:
        reason = "wrong password"
    elif not has_role(user, Role.ADMIN):
        reason = "not an admin"
    else:
        reason = ""
    if reason:
        refuse_password(request, "user.break_glass_sign_in", username, reason)
        return None, None
    forget_failed_sign_ins(username, client_ip(request))
    auth.login(request, user, backend=MODEL_BACKEND)
    record_audit(user, "user.break_glass_sign_in", user, request=request,
                 changes={"outcome": "signed in", "username": username})
    return user, None


@login_not_required
@require_http_methods(["GET", "POST"])
def break_glass(request):
    """Local admin sign-in for when the identity provider is down or misconfigured."""
    if not settings.CLUSTERUI_BREAK_GLASS:
        raise Http404("Break-glass sign-in is turned off (CLUSTERUI_BREAK_GLASS).")
    form = BreakGlassForm(request.POST or None)
    status = 200
    if request.method == "POST" and form.is_valid():
        user, locked = do_break_glass_sign_in(
            request, form.cleaned_data["username"], form.cleaned_data["password"])
        if user is not None:
            return redirect(sign_in_next(request) or settings.LOGIN_REDIRECT_URL)
        if locked is not None:
            form.add_error(None, locked.message)
            status = 429
        else:
            form.add_error(None, "Wrong user name or password, or not a local admin account.")
    return render(request, "registration/break_glass.html",
                  {"form": form, "next": sign_in_next(request)}, status=status)
