"""The data layer: datasets, partitions over clients, and the Federation they make.

>>> from fedlearn_edu.data import federated_dataset, plot_partition
>>> fed = federated_dataset("digits", "dirichlet", num_clients=10, alpha=0.1, seed=0)
>>> fed.num_clients
10
"""

from .datasets import (
    DATASETS,
    DatasetInfo,
    dataset_info,
    federated_dataset,
    load_dataset,
)
from .fallback import dataset_or_digits
from .federation import ClientData, Federation, make_federation
from .noise import add_label_noise, flip_labels, reverse_labels
from .partition import (
    PARTITIONS,
    PartitionScheme,
    dirichlet_partition,
    iid_partition,
    partition_label_counts,
    quantity_skew_partition,
    shard_partition,
)
from .plotting import plot_partition
from .readers import read_cifar_batches, read_idx
from .shifts import (
    SHIFTS,
    cluster_ids,
    concept_permutations,
    label_shift_classes,
    parse_shift,
    permute_labels,
    rotate_images,
    shifted_federation,
)
from .synthetic import SYNTHETIC_CLASSES, SYNTHETIC_DIM, synthetic_federated
from .validation import external_validation_set, resize_images, server_validation_split

__all__ = [
    "reverse_labels",
    "ClientData",
    "Federation",
    "make_federation",
    "DATASETS",
    "DatasetInfo",
    "dataset_info",
    "load_dataset",
    "dataset_or_digits",
    "read_idx",
    "federated_dataset",
    "PARTITIONS",
    "PartitionScheme",
    "read_cifar_batches",
    "iid_partition",
    "dirichlet_partition",
    "shard_partition",
    "quantity_skew_partition",
    "partition_label_counts",
    "flip_labels",
    "add_label_noise",
    "synthetic_federated",
    "SYNTHETIC_DIM",
    "SYNTHETIC_CLASSES",
    "plot_partition",
    "server_validation_split",
    "external_validation_set",
    "resize_images",
    "SHIFTS",
    "shifted_federation",
    "cluster_ids",
    "parse_shift",
    "rotate_images",
    "permute_labels",
    "label_shift_classes",
    "concept_permutations",
]
