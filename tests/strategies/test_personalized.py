"""The personalised and clustered strategies (:mod:`fedlearn_edu.strategies.personalized`): IFCA refuses
more clusters than clients before building them."""

import pytest

from fedlearn_edu import IFCA, simulate


@pytest.mark.parametrize("k", [7, 2**64])
def test_ifca_with_more_clusters_than_clients_is_refused_by_name(fed, mlp, k):
    """IFCA(num_clusters=2**64) used to build cluster models until memory ran out; K > N is refused up front."""
    with pytest.raises(ValueError, match=r"num_clusters=\d+\) needs at most one cluster per client.*6 clients"):
        simulate(fed, mlp(fed), IFCA(num_clusters=k), rounds=1, progress=False)
