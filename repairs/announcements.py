"""A repair moved (a status, a step, its waiting reason): a change row in the same
transaction. The publisher tells the cluster's open Repair tabs and node pages
("repair.changed"), wherever the move was made: a view, a Celery worker."""

from clusters.change_feed import Kind, record_change


def announce_repair_change(repair):
    record_change(Kind.REPAIR, cluster_id=repair.cluster_id, node_id=repair.node_id,
                  object_id=repair.pk)
