"""The runs of the bad-client tests: client :data:`BAD` of the ``setting`` fixture (``tests/conftest.py``)
holds a NaN input; with :data:`SEED` it is selected in every round of :data:`RUN`, at another row.
:data:`SMALL` is the shorter run of the tests whose strategy diverges or is refused."""

BAD = 4  # the client with NaN data; with SEED it is selected every round, at row 2
SEED = 1
RUN = dict(rounds=3, clients_per_round=4, batch_size=16, lr=0.05, seed=SEED, progress=False)
SMALL = dict(rounds=2, clients_per_round=3, batch_size=16, progress=False, engine="loop")
