"""Background saves staged in shared memory and serialized by the forked
writer process (hooks/_staging.py): what a real state holds (batch-norm
buffers, Adam's slots and step counts, bfloat16, bool masks, complex,
empty and shared tensors, int64 counters) comes back exactly, as of the
step it was saved at; what cannot be staged is saved on the step."""
import os

import pytest
import torch

from estimator import checkpoint
import hooks.checkpoint
from hooks import _staging, files


def _real_state(seed: int) -> dict:
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8),
                              torch.nn.Dropout(0.5), torch.nn.Linear(8, 2)).train()
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    for _ in range(2):
        opt.zero_grad()
        net(torch.randn(16, 4, dtype=torch.float64).float()).sum().backward()
        opt.step()
    shared = torch.arange(12.0).view(3, 4)
    return {"modules": {"net": net.state_dict(),
                        "extra": {"half": torch.randn(5).to(torch.bfloat16),
                                  "mask": torch.tensor([True, False, True]),
                                  "phase": torch.tensor([1 + 2j, -3j]),
                                  "empty": torch.empty(0, 7),
                                  "columns": shared.t(),   # (not contiguous)
                                  "counts": torch.tensor([3, 1 << 40])}},
            "optimizers": {"optimizer": opt.state_dict()},
            "tied": [shared, shared], "global_step": 2, "name": "run-α"}


def _equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return (isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape
                and torch.equal(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return a == b


def _snapshot(obj):
    if isinstance(obj, torch.Tensor):
        return obj.clone()
    if isinstance(obj, dict):
        return {k: _snapshot(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_snapshot(v) for v in obj)
    return obj


def _without_rng(state: dict) -> dict:
    return {k: v for k, v in state.items() if k != "rng"}


def test_a_staged_save_holds_the_state_of_its_step_exactly(tmp_path, monkeypatch):
    saver = checkpoint.Saver(str(tmp_path), background=True)
    state = _real_state(0)
    saver.save(state, 1)   # (the first: serialized on the step, checked loadable)
    saver.wait()
    serialized_here = []
    real_save = torch.save
    monkeypatch.setattr(torch, "save", lambda *a, **k: (serialized_here.append(1),
                                                        real_save(*a, **k))[1])
    expected = _snapshot(state)
    saver.save(state, 2)
    # Training goes on while the writer serializes: the live tensors change.
    for tensor in state["modules"]["net"].values():
        tensor.add_(1)
    for slots in state["optimizers"]["optimizer"]["state"].values():
        slots["exp_avg"].mul_(-1)
    state["tied"][0].zero_()
    saver.close()
    assert serialized_here == []   # (torch.save ran in the writer process only)
    restored = checkpoint.load(os.path.join(str(tmp_path), "model.ckpt-2"))
    assert _equal(_without_rng(restored), expected)
    assert restored["tied"][0] is restored["tied"][1]   # one tensor named twice stays one


def test_a_staged_save_equals_a_save_on_the_step(tmp_path):
    states = {}
    for background in (False, True):
        model_dir = str(tmp_path / str(background))
        saver = checkpoint.Saver(model_dir, background=background)
        for step in (1, 2):
            saver.save(_real_state(step), step)
        saver.close()
        states[background] = checkpoint.load(os.path.join(model_dir, "model.ckpt-2"))
    assert _equal(_without_rng(states[True]), _without_rng(states[False]))
    assert _equal(states[True]["rng"]["torch"].shape, states[False]["rng"]["torch"].shape)


def test_a_state_that_outgrows_its_staging_forks_a_new_writer(tmp_path):
    saver = checkpoint.Saver(str(tmp_path), background=True)
    small = {"modules": {"net": {"w": torch.ones(10)}}, "optimizers": {}, "global_step": 1}
    saver.save(small, 1)
    saver.save(small, 2)
    saver.wait()
    first = saver._process.pid
    big = {"modules": {"net": {"w": torch.arange(100_000.0)}}, "optimizers": {},
           "global_step": 3}
    saver.save(big, 3)
    saver.wait()
    assert saver._process.pid != first
    assert saver._staging.nbytes >= 400_000
    saver.close()
    assert torch.equal(checkpoint.load(os.path.join(str(tmp_path), "model.ckpt-3"))
                       ["modules"]["net"]["w"], big["modules"]["net"]["w"])


def test_a_state_with_a_sparse_tensor_is_saved_on_the_step(tmp_path, monkeypatch):
    saver = checkpoint.Saver(str(tmp_path), background=True)
    embedding = torch.sparse_coo_tensor([[0, 2]], [1.0, 5.0], (4,), check_invariants=True)
    state = {"modules": {"net": {"w": torch.ones(3)}}, "optimizers": {},
             "sparse": embedding, "global_step": 1}
    saver.save(state, 1)
    saver.wait()
    assert _staging.Staging.size_of(state) is None
    serialized_here = []
    real_save = torch.save
    monkeypatch.setattr(torch, "save", lambda *a, **k: (serialized_here.append(1),
                                                        real_save(*a, **k))[1])
    saver.save(state, 2)
    saver.close()
    assert serialized_here == [1]
    restored = torch.load(os.path.join(str(tmp_path), "model.ckpt-2"))
    assert torch.equal(restored["sparse"].to_dense(), embedding.to_dense())


def test_saves_are_made_on_the_step_where_no_staging_memory_is_left(
        tmp_path, monkeypatch, caplog):
    import errno

    def no_memory(*args):
        raise OSError(errno.ENOMEM, os.strerror(errno.ENOMEM))
    monkeypatch.setattr(_staging.mmap, "mmap", no_memory)
    saver = checkpoint.Saver(str(tmp_path), background=True)
    for step in (1, 2):
        saver.save({"modules": {"net": {"w": torch.full((3,), float(step))}},
                    "optimizers": {}, "global_step": step}, step)
        assert not saver.in_flight
    assert "the background writer process cannot start" in caplog.text
    assert os.strerror(errno.ENOMEM) in caplog.text
    restored = checkpoint.load(checkpoint.latest_checkpoint(str(tmp_path)))
    assert torch.equal(restored["modules"]["net"]["w"], torch.full((3,), 2.0))


def test_staging_refuses_what_it_cannot_hold():
    staging = _staging.Staging(1024)
    assert staging.stage({"w": torch.ones(1000)}) is None   # (4000 bytes)
    assert staging.stage({"w": torch.ones(2).to_sparse()}) is None
    assert staging.stage({"w": torch.ones(10)}) is not None


@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGTERM"])
def test_the_writer_leaves_group_signals_to_its_parent(tmp_path, signal_name):
    """Ctrl-C or a scheduler's SIGTERM reach the whole process group: the
    writer ignores them (the parent finishes the save in hand, then ends it)."""
    import signal
    writer = files.WriterProcess()
    try:
        os.kill(writer.pid, getattr(signal, signal_name))
        writer.submit([("write", str(tmp_path / "f"), b"data", True)])
        writer.result()
        assert (tmp_path / "f").read_bytes() == b"data"
    finally:
        writer.close()
    assert writer._proc.returncode == 0


def test_a_writer_ends_when_closed_while_a_later_fork_holds_its_pipe(tmp_path):
    """A process forked after the writer (a DataLoader worker) holds the
    writer's pipe open: closing the writer still ends it at once (it waited
    for the end of the pipe, then was killed after 60 s)."""
    import time
    writer = files.WriterProcess()
    worker = os.fork()
    if worker == 0:
        time.sleep(30)
        os._exit(0)
    try:
        start = time.monotonic()
        writer.close(timeout=10)
        assert time.monotonic() - start < 5
        assert writer._proc.returncode == 0
    finally:
        os.kill(worker, 9)
        os.waitpid(worker, 0)


def test_a_state_staging_cannot_measure_is_saved_on_the_step(tmp_path, monkeypatch):
    """Tensors that pickle reaches and the staging's measure does not (inside
    an allowed class of the user's) leave the staging too small even after
    the writer is forked again: the save is made as a first save is."""
    monkeypatch.setattr(_staging.Staging, "size_of", staticmethod(lambda obj: 8))
    saver = checkpoint.Saver(str(tmp_path), background=True)
    for step in (1, 2):
        saver.save({"modules": {"net": {"w": torch.full((100,), float(step))}},
                    "optimizers": {}, "global_step": step}, step)
    saver.close()
    restored = checkpoint.load(checkpoint.latest_checkpoint(str(tmp_path)))
    assert torch.equal(restored["modules"]["net"]["w"], torch.full((100,), 2.0))


def test_the_writer_refuses_a_staged_state_that_is_not_finite(tmp_path, monkeypatch):
    """The NaN check of a staged save runs in the writer process, on the copy
    it would write: NaN in an Adam slot is refused there (NotFiniteError, as
    itself, naming the slot and the step), no file of it is left and nothing
    is evicted; a causal mask of -inf in a buffer saves; the writer goes on."""
    model_dir = str(tmp_path)
    saver = checkpoint.Saver(model_dir, max_to_keep=2, background=True)
    state = _real_state(0)
    state["modules"]["net"]["mask"] = torch.full((3, 3), -float("inf")).triu(1)
    finite = {"net": {"1.running_mean", "1.running_var", "1.num_batches_tracked", "mask"}}
    for step in (1, 2):
        saver.save(state, step, finite=finite)
        saver.wait()
    slot = state["optimizers"]["optimizer"]["state"][0]["exp_avg"]
    slot[0, 1] = float("nan")
    monkeypatch.setattr(hooks.checkpoint, "_first_nonfinite",   # (the parent's: never called)
                        lambda *a: pytest.fail("checked on the step"))
    saver.save(state, 3, finite=finite)   # (staged: checked by the writer)
    with pytest.raises(checkpoint.NotFiniteError, match="optimizer/state/0/exp_avg is not "
                       "finite at global step 3") as caught:
        saver.wait()
    assert (caught.value.name, caught.value.global_step) == ("optimizer/state/0/exp_avg", 3)
    assert sorted(os.listdir(model_dir)) == sorted(
        ["checkpoint", "model.ckpt-1", "model.ckpt-1.crc32c", "model.ckpt-2",
         "model.ckpt-2.crc32c"])
    slot[0, 1] = 0.0
    saver.save(state, 4, finite=finite)
    saver.close()
    assert [checkpoint.step_of(p) for p in checkpoint.all_checkpoints(model_dir)] == [2, 4]
