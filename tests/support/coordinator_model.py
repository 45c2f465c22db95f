"""What a ClusterCoordinator test schedules (importable by every task:
torch.distributed.rpc ships functions by name)."""
import collections
import os
import time

import torch

FEATURES = 4
STEP_SECS = float(os.environ.get("COORDINATOR_STEP_SECS", "0.05"))
# A test that must kill a worker mid-function creates HOLD_DIR/hold-<pid>:
# that worker's next step writes HOLD_DIR/held-<pid> and waits there.
HOLD_DIR = os.environ.get("COORDINATOR_HOLD_DIR")


def make_net():
    torch.manual_seed(0)
    return torch.nn.Linear(FEATURES, 2)


def make_sgd(params):
    return torch.optim.SGD(params, lr=0.5)


class SparseNet(torch.nn.Module):
    """The linear model plus a sparse embedding of the first feature's
    bucket (its gradient a sparse tensor: the rows of the batch)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(FEATURES, 2)
        self.buckets = torch.nn.Embedding(40, 2, sparse=True)

    def forward(self, x):
        ids = (x[:, 0] * 4).long().clamp(-20, 19) + 20
        return self.linear(x) + self.buckets(ids)


def make_adagrad(params):
    return torch.optim.Adagrad(params, lr=0.5)


class NotedNet(torch.nn.Module):
    """The linear model plus a dense table of 40 rows (nonzero) looked up
    at the first feature's bucket, rows 0-29 alone, its lookups noted
    (`est.optimizers.looked_up`, as a feature column's): rows 30-39 are
    never read."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(FEATURES, 2)
        self.table = torch.nn.Parameter(torch.randn(40, 2))

    def forward(self, x):
        import estimator as est   # (only here: the other models need torch alone)
        ids = (x[:, 0] * 4).long().clamp(-20, 9) + 20
        est.optimizers.looked_up(self.table, ids)
        return self.linear(x) + self.table[ids]


class BNNet(torch.nn.Module):
    """The linear model on batch-normalized inputs, given shifted and
    scaled (x * 2 + 3): trained moving statistics near 3 and 4, the
    initial ones (0 and 1) normalize them wrongly."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.norm = torch.nn.BatchNorm1d(FEATURES)
        self.linear = torch.nn.Linear(FEATURES, 2)
        self.register_buffer("calls", torch.zeros(()))   # replaced at each call
        self.register_buffer("seen", torch.tensor(False))   # a flag: no change adds up

    def forward(self, x):
        if self.training:
            self.calls = self.calls + 1
            self.seen.fill_(True)
        return self.linear(self.norm(x * 2 + 3))


def make_ftrl(params):
    import estimator as est
    return est.optimizers.Ftrl(params, lr=0.5)


def data(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, FEATURES, generator=g)
    y = (x[:, 0] - x[:, 1] + 0.5 * x[:, 2] > 0).long()
    return x, y


def dataset_fn(input_context):
    """Each worker's own endless stream (seeded by its index)."""
    x, y = data(4096, 100 + input_context.input_pipeline_id)

    def batches():
        i = 0
        while True:
            yield x[i:i + 64], y[i:i + 64]
            i = (i + 64) % 4032
    return batches()


def train_step(iterator, net, optimizer, step):
    x, y = next(iterator)
    optimizer.zero_grad()
    loss = torch.nn.functional.cross_entropy(net(x), y)
    loss.backward()
    time.sleep(STEP_SECS)
    if HOLD_DIR and os.path.exists(os.path.join(HOLD_DIR, f"hold-{os.getpid()}")):
        open(os.path.join(HOLD_DIR, f"held-{os.getpid()}"), "w").close()
        time.sleep(60)   # until the test kills this worker
    optimizer.step()
    return {"step": step, "loss": loss.detach(), "pid": os.getpid()}


def accuracy(state):
    net = (SparseNet() if any(k.startswith("buckets") for k in state) else
           NotedNet() if "table" in state else BNNet() if "norm.running_mean" in state
           else make_net())
    net.load_state_dict(state)
    net.eval()
    x, y = data(2000, 7)
    return float((net(x).argmax(1) == y).float().mean())


# -- what test_coordinator's semantics scenario schedules ------------------------------------
Pair = collections.namedtuple("Pair", "a b")


def finite_list(input_context):
    """5 elements on each worker, tagged with its index (re-iterable)."""
    return [(input_context.input_pipeline_id, i) for i in range(5)]


def finite_generator(input_context):
    """The same, one-shot: a generator."""
    return ((input_context.input_pipeline_id, i) for i in range(5))


def with_default(start=10):
    """A dataset_fn whose parameter is not an input context."""
    return [(start, i) for i in range(5)]


def take(iterator):
    return next(iterator)


def swap(pair):
    return Pair(pair.b, pair.a), collections.OrderedDict(b=pair.b, a=pair.a)


def boom():
    raise ValueError("boom")


def slow_mark(i, path):
    time.sleep(0.3)
    with open(path, "a") as f:
        f.write(f"{i}\n")
    return i


def slow_boom(secs):
    time.sleep(secs)
    raise RuntimeError(f"boom after {secs}")


def slow_value(secs, value):
    time.sleep(secs)
    return value
