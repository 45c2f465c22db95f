"""The session loop: MonitoredSession and MonitoredTrainingSession.

The only thing that calls hooks. The Estimator's train/evaluate/predict run on
it, and custom loops use it directly as TF1 pipelines used
`tf.compat.v1.train.MonitoredTrainingSession`:

    with hooks.MonitoredTrainingSession(checkpoint_dir="runs/x",
                                        hooks=[hooks.StopAtStepHook(last_step=100)]) as sess:
        net = est.get_module("net", lambda: torch.nn.Linear(4, 1))  # restored if saved
        opt = est.get_optimizer(lambda p: torch.optim.SGD(p, lr=0.1))
        while not sess.should_stop():
            sess.run(train_step, batch)   # train_step returns the loss (or a dict)

One `run` is one step: in training the session increments the global step
after it. A step that no hook asks anything of never copies to the host.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Dict, Iterable, List, Optional

import torch

from estimator import _scope, checkpoint
from estimator.mode_keys import ModeKeys

from .session_run_hook import SessionRunArgs, SessionRunContext, SessionRunHook, SessionRunValues

logger = logging.getLogger(__name__)


def _to_host(values: Dict[str, Any]) -> Dict[str, Any]:
    """Copy the fetched tensors to the host, once per step for all hooks: a
    scalar becomes a Python number, anything else a numpy array."""
    out = {}
    for name, value in values.items():
        if isinstance(value, torch.Tensor):
            value = value.detach()
            value = value.item() if value.numel() == 1 and value.dim() == 0 else value.cpu().numpy()
        out[name] = value
    return out


class _Coordinator:
    """The `coord` of `after_create_session` (tf.train.Coordinator, minimal)."""

    def __init__(self):
        self._stop = False

    def request_stop(self, ex=None):
        self._stop = True

    def should_stop(self) -> bool:
        return self._stop


class _Session:
    """What hooks receive as `session` (there is no tf.Session): the model scope,
    the global step, the strategy and where the chief writes."""

    def __init__(self, scope, model_dir: Optional[str], is_chief: bool):
        self.scope = scope
        self.model_dir = model_dir
        self.is_chief = is_chief

    @property
    def strategy(self):
        return self.scope.strategy

    @property
    def mode(self) -> str:
        return self.scope.mode

    @property
    def global_step(self) -> int:
        return self.scope.global_step


class MonitoredSession:
    """Runs steps with hooks around them (tf.compat.v1.train.MonitoredSession).

    `scope` is the model scope the steps build into (its mode says whether a
    step increments the global step). Exiting the `with` block normally, or
    because the input ran out (StopIteration from the step), calls every hook's
    `end`; an exception propagates without it, as in TF.
    """

    def __init__(self, scope, hooks: Iterable[SessionRunHook] = (),
                 model_dir: Optional[str] = None, is_chief: Optional[bool] = None):
        self._scope = scope
        self._hooks: List[SessionRunHook] = list(hooks)
        for hook in self._hooks:
            if not isinstance(hook, SessionRunHook):
                raise TypeError(f"hooks must be SessionRunHook instances, got {hook!r}")
        if is_chief is None:
            is_chief = scope.strategy.extended.should_checkpoint
        self._session = _Session(scope, model_dir, is_chief)
        self._train = scope.mode == ModeKeys.TRAIN
        self._stop = False
        self._entered = False

    # -- context -------------------------------------------------------------
    def __enter__(self) -> "MonitoredSession":
        self._scope.__enter__()
        self._strategy_scope = self._scope.strategy.scope()
        self._strategy_scope.__enter__()
        self._entered = True
        try:
            for hook in self._hooks:
                hook.begin()
            coord = _Coordinator()
            for hook in self._hooks:
                hook.after_create_session(self._session, coord)
            self._stop = coord.should_stop()
        except BaseException:
            self._leave()
            raise
        return self

    def __exit__(self, exc_type, exc, tb):
        try:
            if exc_type is None or issubclass(exc_type, StopIteration):
                for hook in self._hooks:
                    hook.end(self._session)
        finally:
            self._leave()
        return exc_type is not None and issubclass(exc_type, StopIteration)

    def close(self) -> None:
        self.__exit__(None, None, None)

    def _leave(self):
        if self._entered:
            self._entered = False
            self._strategy_scope.__exit__(None, None, None)
            self._scope.__exit__(None, None, None)

    # -- the loop ------------------------------------------------------------
    @property
    def session(self) -> _Session:
        return self._session

    def should_stop(self) -> bool:
        return self._stop

    def run(self, step_fn: Callable, *args, **kwargs):
        """Run one step `step_fn(*args, **kwargs)` with the hooks around it.

        The step returns its loss tensor, a dict of named tensors, or an
        EstimatorSpec; those (and `est.named_tensor`s) are what fetches name.
        A step that raises StopIteration (input exhausted) ends the loop.
        """
        context = SessionRunContext(SessionRunArgs(None), self._session)
        requests = []
        scope = self._scope
        for hook in self._hooks:
            request = hook.before_run(context)
            if request is not None and request.fetches is not None:
                requests.append((hook, request.fetches))
        if requests:
            scope.summaries_due = any("summaries" in _names(f) for _, f in requests)
        try:
            outputs = step_fn(*args, **kwargs)
        except StopIteration:
            self._stop = True
            scope.summaries_due = False
            return None
        if self._train:
            scope.global_step += 1
        if requests:
            names = {n for _, fetches in requests for n in _names(fetches)}
            host = _to_host({n: self._resolve(n, outputs) for n in names})
            for hook, fetches in requests:
                hook.after_run(context, SessionRunValues(_structure(fetches, host)))
            scope.summaries_due = False
            scope.summaries.clear()
        no_values = SessionRunValues(None)
        asked = {id(h) for h, _ in requests}
        for hook in self._hooks:
            if id(hook) not in asked:
                hook.after_run(context, no_values)
        scope.named_tensors.clear()
        if context.stop_requested:
            self._stop = True
        return outputs

    def _resolve(self, name: str, outputs):
        scope = self._scope
        if name == "global_step":
            return scope.global_step
        if name == "summaries":
            return list(scope.summaries)
        if name in scope.named_tensors:
            return scope.named_tensors[name]
        if name == "loss":
            loss = getattr(outputs, "loss", outputs if isinstance(outputs, torch.Tensor) else None)
            if loss is None and isinstance(outputs, dict):
                loss = outputs.get("loss")
            if loss is not None:
                return scope.strategy.extended._reduce_loss(loss)
        exposed = getattr(outputs, "predictions", outputs)
        if isinstance(exposed, dict) and name in exposed:
            return exposed[name]
        available = ["global_step", "summaries", "loss", *scope.named_tensors,
                     *(exposed if isinstance(exposed, dict) else ())]
        raise KeyError(f"A hook fetches {name!r}, which this step does not expose; "
                       f"available: {sorted(set(available))}. Name a tensor in the "
                       "model_fn with est.named_tensor(name, tensor)")


def _names(fetches) -> List[str]:
    if isinstance(fetches, str):
        return [fetches]
    if isinstance(fetches, dict):
        return [n for v in fetches.values() for n in _names(v)]
    if isinstance(fetches, (list, tuple)):
        return [n for v in fetches for n in _names(v)]
    raise TypeError(f"SessionRunArgs fetches must be names (str), lists or dicts of "
                    f"names, got {fetches!r}")


def _structure(fetches, host):
    if isinstance(fetches, str):
        return host[fetches]
    if isinstance(fetches, dict):
        return {k: _structure(v, host) for k, v in fetches.items()}
    return type(fetches)(_structure(v, host) for v in fetches)
