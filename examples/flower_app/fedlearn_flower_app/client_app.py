"""The ClientApp: each SuperNode trains the package's model on its own partition."""

from flwr.app import Context

from fedlearn_edu.flower import Node, make_client_app, node_partition

from .task import client_strategy, load_setting


def node(context: Context) -> Node:
    setting = load_setting(context.run_config, int(context.node_config["num-partitions"]))
    pid, data = node_partition(context, setting.federation)
    return Node(setting.model, data, pid, setting.federation.num_classes, client_strategy(context.run_config))


app = make_client_app(node)
