"""Cluster settings > Notifications: admins add, change, test and delete channels; every
role reads them and their delivery logs."""

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from clusters.queries import get_cluster_for_user
from clusters.roles import Role, has_role, require_role

from .forms import ChannelForm
from .models import Channel
from .queries import channel_rows, delivery_log
from .services import (
    do_create_channel,
    do_delete_channel,
    do_rotate_signing_key,
    do_send_test,
    do_update_channel,
)


def _channel(request, slug, channel_id):
    cluster = get_cluster_for_user(request, slug)
    return get_object_or_404(Channel.objects.select_related("cluster"), cluster=cluster,
                             pk=channel_id)


@require_GET
@require_role(Role.VIEWER)
def channel_list(request, slug):
    cluster = get_cluster_for_user(request, slug)
    return render(request, "notifications/list.html",
                  {"cluster": cluster, "tab": "settings", "rows": channel_rows(cluster)})


@require_http_methods(["GET", "POST"])
@require_role(Role.ADMIN)
def channel_create(request, slug):
    cluster = get_cluster_for_user(request, slug)
    form = ChannelForm(request.POST or None, cluster=cluster)
    if request.method == "POST" and form.is_valid():
        channel, key = do_create_channel(
            cluster, name=form.cleaned_data["name"], kind=form.cleaned_data["kind"],
            url=form.cleaned_data["url"], rules=form.rules(), actor=request.user,
            request=request, **form.timing())
        messages.success(request, f"Channel {channel.name} added. Send a test message to see "
                                  f"that it arrives.")
        if key is None:
            return redirect("notifications:detail", cluster.slug, channel.pk)
        return render(request, "notifications/signing_key.html",
                      {"cluster": cluster, "tab": "settings", "channel": channel, "key": key})
    return render(request, "notifications/edit.html",
                  {"cluster": cluster, "tab": "settings", "form": form, "channel": None},
                  status=400 if form.errors else 200)


@require_http_methods(["GET", "POST"])
@require_role(Role.VIEWER)
def channel_detail(request, slug, channel_id):
    channel = _channel(request, slug, channel_id)
    if request.method == "POST" and not has_role(request.user, Role.ADMIN):
        raise PermissionDenied("Changing notification channels needs the admin role.")
    form = ChannelForm(request.POST or None, instance=channel, cluster=channel.cluster)
    if request.method == "POST" and form.is_valid():
        changed = do_update_channel(channel, name=form.cleaned_data["name"],
                                    url=form.cleaned_data["url"], rules=form.rules(),
                                    actor=request.user, request=request, **form.timing())
        messages.success(request, f"Saved: {', '.join(changed)}." if changed
                         else "Nothing changed.")
        return redirect("notifications:detail", channel.cluster.slug, channel.pk)
    channel.refresh_from_db()
    return render(request, "notifications/edit.html",
                  {"cluster": channel.cluster, "tab": "settings", "form": form,
                   "channel": channel, "log": delivery_log(channel)},
                  status=400 if form.errors else 200)


@require_GET
@require_role(Role.VIEWER)
def channel_deliveries(request, slug, channel_id):
    """The delivery log alone (htmx: the channel's page refreshes it). Opened directly (a
    bookmark, a link), it is the channel's page, where the log is."""
    channel = _channel(request, slug, channel_id)
    if not request.htmx:
        return redirect("notifications:detail", channel.cluster.slug, channel.pk)
    return render(request, "notifications/edit.html#delivery-log",
                  {"cluster": channel.cluster, "channel": channel, "log": delivery_log(channel)})


@require_POST
@require_role(Role.ADMIN)
def channel_test(request, slug, channel_id):
    channel = _channel(request, slug, channel_id)
    do_send_test(channel, actor=request.user, request=request)
    messages.success(request, "Test message queued: its delivery shows in the log below.")
    return redirect("notifications:detail", channel.cluster.slug, channel.pk)


@require_POST
@require_role(Role.ADMIN)
def channel_rotate(request, slug, channel_id):
    channel = _channel(request, slug, channel_id)
    if channel.kind != Channel.Kind.WEBHOOK:
        messages.error(request, "Only webhook channels have a signing key.")
        return redirect("notifications:detail", channel.cluster.slug, channel.pk)
    key = do_rotate_signing_key(channel, actor=request.user, request=request)
    channel.refresh_from_db()
    return render(request, "notifications/signing_key.html",
                  {"cluster": channel.cluster, "tab": "settings", "channel": channel,
                   "key": key, "rotated": True})


@require_POST
@require_role(Role.ADMIN)
def channel_delete(request, slug, channel_id):
    channel = _channel(request, slug, channel_id)
    do_delete_channel(channel, actor=request.user, request=request)
    messages.success(request, f"Channel {channel.name} deleted.")
    return redirect("notifications:list", slug)
