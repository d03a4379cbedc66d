from healthchecks.gpu_lost import do_judge_inventory
from nodes.services import do_record_hello


def say_hello(node, **hello):
    """A hello as the agent gateway records it (gateway.ingest.accept_hello): the node's
    facts (nodes.services.do_record_hello), then the inventory rule. Returns the node."""
    node = do_record_hello(node, **hello)
    do_judge_inventory(node, now=hello.get("now"))
    node.refresh_from_db()
    return node
