import pytest

from agent.config import Fault, InjectSpecError, check_gpu_indexes, parse_inject


@pytest.mark.parametrize(
    "spec, faults",
    [
        ("xid:79@30s", [Fault("xid", 30.0, gpu=0, xid=79)]),
        ("xid:48@10s:gpu3", [Fault("xid", 10.0, gpu=3, xid=48)]),
        ("thermal@60s", [Fault("thermal", 60.0)]),
        ("thermal@60s+30s", [Fault("thermal", 60.0, duration_s=30.0)]),
        ("thermal@1.5s+0.5s:gpu7", [Fault("thermal", 1.5, gpu=7, duration_s=0.5)]),
        ("gpu_lost@90s:gpu2", [Fault("gpu_lost", 90.0, gpu=2)]),
        ("xid_storm:13@20s", [Fault("xid_storm", 20.0, xid=13)]),
        ("xid_storm:79@1.5s:gpu4", [Fault("xid_storm", 1.5, gpu=4, xid=79)]),
        ("ecc_dbe@40s:gpu2", [Fault("ecc_dbe", 40.0, gpu=2)]),
        (
            "xid:79@30s,thermal@60s, gpu_lost@0s",
            [Fault("xid", 30.0, xid=79), Fault("thermal", 60.0), Fault("gpu_lost", 0.0)],
        ),
    ],
)
def test_good_specs(spec, faults):
    assert parse_inject(spec) == faults


@pytest.mark.parametrize(
    "spec, words",
    [
        ("", "bad --inject item ''"),
        ("xid:79", "bad --inject item 'xid:79'"),
        ("xid@30s", "bad --inject item 'xid@30s'"),
        ("xid:79@30", "bad --inject item 'xid:79@30'"),
        ("xid:79@-5s", "bad --inject item"),
        ("xid:0@5s", "Xid codes start at 1"),
        ("xid_storm:0@5s", "Xid codes start at 1"),
        ("xid_storm@5s", "bad --inject item 'xid_storm@5s'"),
        ("xid_storm:13@5s+10s", "only thermal takes a duration"),
        ("ecc_dbe@5s+10s", "only thermal takes a duration"),
        ("ecc_dbe:2@5s", "bad --inject item"),
        ("xid:79@30s+10s", "only thermal takes a duration"),
        ("gpu_lost@5s+10s", "only thermal takes a duration"),
        ("thermal@5s+0s", "the duration must be above 0 s"),
        ("thermal@5s:gpu", "bad --inject item"),
        ("fire@5s", "bad --inject item 'fire@5s'"),
        ("xid:79@30s,", "bad --inject item ''"),
    ],
)
def test_bad_specs_say_what_is_wrong(spec, words):
    with pytest.raises(InjectSpecError, match=words):
        parse_inject(spec)


def test_a_malformed_item_is_answered_with_the_accepted_forms():
    with pytest.raises(InjectSpecError) as raised:
        parse_inject("xid79@30s")

    assert "xid:79@30s, xid:48@10s:gpu3, thermal@60s, thermal@60s+30s:gpu1" in str(raised.value)


def test_a_gpu_the_node_does_not_have_is_refused():
    faults = parse_inject("xid:79@1s:gpu8")

    check_gpu_indexes(faults, gpu_count=9)
    with pytest.raises(InjectSpecError, match="gpu8, but the simulated node has 8 GPUs"):
        check_gpu_indexes(faults, gpu_count=8)
