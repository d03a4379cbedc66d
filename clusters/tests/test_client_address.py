"""The client's address (issue 15, point 5): the socket's peer, or behind trusted proxies the
rightmost X-Forwarded-For entry that is not one of them; never the leftmost one, which the
client writes."""

import ipaddress

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import RequestFactory

from clusters.services import client_ip
from clusterui.settings import envnetworks


def address(remote, forwarded=None):
    headers = {"HTTP_X_FORWARDED_FOR": forwarded} if forwarded is not None else {}
    return client_ip(RequestFactory().get("/", REMOTE_ADDR=remote, **headers))


@pytest.fixture
def proxies(settings):
    settings.CLUSTERUI_TRUSTED_PROXIES = (ipaddress.ip_network("10.0.0.0/8"),
                                          ipaddress.ip_network("2001:db8::/32"))


def test_without_trusted_proxies_the_header_is_ignored(settings):
    settings.CLUSTERUI_TRUSTED_PROXIES = ()
    assert address("203.0.113.9", "1.2.3.4") == "203.0.113.9"


@pytest.mark.usefixtures("proxies")
@pytest.mark.parametrize("remote, forwarded, client", [
    ("10.0.0.2", "1.2.3.4, 203.0.113.9", "203.0.113.9"),  # 1.2.3.4: written by the client
    ("10.0.0.2", "1.2.3.4, 203.0.113.9, 10.0.0.5", "203.0.113.9"),  # two proxies
    ("10.0.0.2", "10.1.1.1, 10.0.0.5", "10.1.1.1"),  # every hop a proxy: the farthest
    ("10.0.0.2", "203.0.113.9, not-an-address", "10.0.0.2"),  # the walk ends at the proxy
    ("10.0.0.2", "", "10.0.0.2"),
    ("10.0.0.2", None, "10.0.0.2"),
    ("203.0.113.9", "10.0.0.7", "203.0.113.9"),  # not from a proxy: the header is ignored
    ("2001:db8::1", "2001:db8::2 , 2001:db9::3", "2001:db9::3"),
    ("10.0.0.2", "::ffff:203.0.113.9", "203.0.113.9"),  # an IPv4 client of an IPv6 proxy
])
def test_behind_trusted_proxies_the_client_is_the_rightmost_untrusted_hop(remote, forwarded,
                                                                            client):
    assert address(remote, forwarded) == client


def test_trusted_proxies_are_read_from_the_environment(monkeypatch):
    monkeypatch.setenv("CLUSTERUI_TRUSTED_PROXIES", "10.0.0.0/8, 192.0.2.1,2001:db8::/32")
    assert [str(n) for n in envnetworks("CLUSTERUI_TRUSTED_PROXIES")] == [
        "10.0.0.0/8", "192.0.2.1/32", "2001:db8::/32"]
    monkeypatch.setenv("CLUSTERUI_TRUSTED_PROXIES", "10.0.0.0/8, proxy.example")
    with pytest.raises(ImproperlyConfigured, match="'proxy.example' is not an address"):
        envnetworks("CLUSTERUI_TRUSTED_PROXIES")
