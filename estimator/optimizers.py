"""TF1's optimizers that the canned estimators need and torch lacks or defines
differently, and the canned estimators' optimizer names.

- `Ftrl`: ``tf.compat.v1.train.FtrlOptimizer`` (FTRL-Proximal; kernels
  ``ApplyFtrl`` / ``ApplyFtrlV2``), the linear models' default.
- `RMSProp`: ``tf.compat.v1.train.RMSPropOptimizer`` (kernels ``ApplyRMSProp``
  / ``ApplyCenteredRMSProp``): its mean-square slot starts at ones and epsilon
  sits inside the square root, unlike ``torch.optim.RMSprop``.
- `Adam`: ``tf.compat.v1.train.AdamOptimizer`` (kernel ``ApplyAdam``): epsilon
  added before the bias correction, unlike ``torch.optim.Adam``.
- `ProximalAdagrad`, `ProximalGradientDescent`:
  ``tf.compat.v1.train.ProximalAdagradOptimizer`` /
  ``ProximalGradientDescentOptimizer`` (FOBOS with L1 and L2; kernels
  ``ApplyProximalAdagrad`` / ``ApplyProximalGradientDescent``), which TF's
  canned-estimator docs pass as ``optimizer=``; torch has neither.
- `optimizer_factory(optimizer, learning_rate)`: a canned estimator's
  ``optimizer=`` (TF: ``canned/optimizers.py``'s ``get_optimizer_instance``)
  as a factory ``params -> torch.optim.Optimizer``.

Updates are in-place tensor ops on the parameters' device, with no host sync.
Hyperparameters are rounded to the parameter's dtype where TF does its
arithmetic on them in that dtype, so float32 steps equal TF's to rounding
(``tests/estimator/test_optimizers.py`` checks recorded TF 2.15 steps).
"""
from __future__ import annotations

import difflib
import struct
from typing import Callable, Iterable, Optional

import torch
import torch.distributed as dist

from distribute import lookups

__all__ = ["Ftrl", "RMSProp", "Adam", "Momentum", "ProximalAdagrad", "ProximalGradientDescent",
           "looked_up", "optimizer_factory", "OPTIMIZER_NAMES"]


def _one_of_replicas() -> bool:
    """Whether this process is one of several data-parallel replicas (a
    process group of more than one): unless the strategy made a table's rows
    read the union over them (`lookups.agree`), only its rows with a
    gradient, the same on every replica, are updated."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def looked_up(param: torch.Tensor, ids: Optional[torch.Tensor] = None) -> None:
    """Note that a training step's lookup (TF's ``embedding_lookup``, whose
    gradient is sparse: IndexedSlices of the rows read) read the rows `ids`
    (indices, or a boolean mask of `param`'s rows) of the table `param`. This
    module's optimizers then update those rows alone, as TF's sparse apply,
    where a dense gradient's zero rows would move their slots or weights:
    `RMSProp`, `Ftrl` (with `l2_shrinkage`, or a table not starting at
    zeros), `ProximalAdagrad` and `ProximalGradientDescent` with L1 or L2.
    The feature columns' tables (an embedding column's
    ``embedding_weights``, a linear model's categorical ``weights``) do this
    themselves; a table of your own read with ``param[ids]`` may
    (``nn.Embedding(sparse=True)``, a sparse gradient, needs nothing): read
    it in its module's forward, which under MirroredStrategy averages its
    gradients over the replicas. Nothing without gradients or for a frozen
    table; the rows noted while a table's gradient is set aside (set to
    None before a step it does not take) are dropped with it.

    `looked_up(param)`, without ids, where the table is made (the module's
    factory): under a data-parallel strategy the Estimator's step then takes
    the rows any replica read (`distribute.lookups`); a table not declared so
    is known to each replica alone, and there the rows with a gradient are
    updated (the same on every replica: a row read whose gradient sums to
    exactly zero is left)."""
    if ids is None:
        lookups.declare(param)
    else:
        lookups.note(param, ids)


def _learning_rate(learning_rate, lr, name: str, zero: bool = True) -> float:
    """TF's `learning_rate`, or torch's `lr` (the param-group key: a parameter
    server rebuilds an optimizer as ``cls(params, **defaults)``). 0.0 (a
    warmup's first step) trains as TF1's, but with `zero=False` (TF's Ftrl
    makes NaNs of it, its ProximalAdagrad fails at the step)."""
    if learning_rate is None:
        learning_rate = lr
    if learning_rate is None:
        raise TypeError(f"{name} needs learning_rate")
    if not (learning_rate >= 0.0 if zero else learning_rate > 0.0):
        raise ValueError(f"learning_rate must be positive{' or zero' if zero else ''}, "
                         f"got {learning_rate}")
    return learning_rate


def _in_dtype(dtype: torch.dtype) -> Callable[[float], float]:
    """Rounds a Python float as TF's cast of a hyperparameter to the variable's
    dtype does (float32 only; other dtypes keep the double)."""
    if dtype == torch.float32:
        return lambda x: struct.unpack("f", struct.pack("f", x))[0]
    return float


class _PerParameter(torch.optim.Optimizer):
    """`step` applies `_update(group, w, grad, state)` in place to each parameter
    with a gradient; parameters whose ``.grad`` is None are skipped. A sparse
    gradient (``nn.Embedding(sparse=True)``, TF's IndexedSlices of
    ``embedding_lookup``) goes to `_update_rows`, as does the dense gradient
    of a table whose lookups were noted (`looked_up`): the rows read and the
    rows with a gradient, where the rule updates each row from its own values
    (`_rows_alone`).

    A subclass has `_update`, which makes the state with `_init_state` when
    empty."""

    _rows_alone = True   # TF's sparse apply leaves the rows not in the gradient

    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)
        if self._rows_alone:   # (a table's rows read are kept for its first step, however
            for w in self.param_groups[-1]["params"]:   # many backward passes before it)
                lookups.will_ask(w)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """As torch's; gradients zeroed in place (``set_to_none=False``) are
        set aside as None ones are: the rows read for them are not stepped.
        Set to None here without torch's profiler record (15-25 us a call on
        a 2-core CPU: a canned estimator's every step makes one)."""
        if set_to_none:
            for group in self.param_groups:
                for w in group["params"]:
                    w.grad = None
            return
        if self._rows_alone:
            for group in self.param_groups:
                for w in group["params"]:
                    if w.grad is not None and lookups.noted(w):
                        lookups.set_aside(w)
        super().zero_grad(set_to_none)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for w in group["params"]:
                if w.grad is None:   # (rows read by lookups the loss did not reach:
                    if self._rows_alone and lookups.noted(w):   # no gradient, as
                        lookups.stepped(w)   # TF's, whose apply has no IndexedSlices)
                    continue
                state = self.state[w]
                if w.grad.is_sparse:   # a repeated row's gradients summed first,
                    g = w.grad.coalesce()   # as TF's sparse apply
                    self._update_rows(group, w, g.indices()[0], g.values(), state)
                    continue
                table = self._rows_alone and lookups.noted(w)
                if table and self._rows_matter(group, w, state):
                    rows = w.grad.ne(0).flatten(1).any(1)
                    if lookups.agreed(w) or not _one_of_replicas():
                        rows |= lookups.rows(w)
                    rows = rows.nonzero().squeeze(1)
                    self._update_rows(group, w, rows, w.grad.index_select(0, rows), state)
                else:
                    self._update(group, w, w.grad, state)
                if table:
                    lookups.stepped(w)   # (the rows read: the next step's)
        return loss

    def _update(self, group: dict, w: torch.Tensor, g: torch.Tensor, state: dict) -> None:
        raise NotImplementedError

    def _init_state(self, group: dict, w: torch.Tensor, state: dict) -> None:
        """The slots of `w` before its first step (none by default)."""

    def _rows_matter(self, group: dict, w: torch.Tensor, state: dict) -> bool:
        """Whether a dense step with zero gradients in the rows not read would
        move them (the sparse apply leaves them): by default, yes."""
        return True

    def _update_rows(self, group: dict, w: torch.Tensor, rows: torch.Tensor, g: torch.Tensor,
                     state: dict) -> None:
        """TF's sparse apply: `_update` of the rows `rows` of `w` and of its
        slots alone, `g` their gradients."""
        if not state:
            self._init_state(group, w, state)
        full = [k for k, v in state.items()
                if isinstance(v, torch.Tensor) and v.shape == w.shape]
        taken = dict(state, **{k: state[k].index_select(0, rows) for k in full})
        part = w.index_select(0, rows)
        self._update(group, part, g, taken)
        w.index_copy_(0, rows, part)
        for k in full:
            state[k].index_copy_(0, rows, taken[k])


class Ftrl(_PerParameter):
    """FTRL-Proximal: ``tf.compat.v1.train.FtrlOptimizer``, with dense gradients
    and sparse ones (``nn.Embedding(sparse=True)``: the rows of the batch alone
    updated, as TF's SparseApplyFtrl updates an ``embedding_lookup``'s, and so
    for a table whose lookups are noted, `looked_up`); any other dense
    gradient recomputes every row, as TF's ApplyFtrl: a row never seen is
    set to what its zero ``linear`` gives, 0, in place of its initial value.

    State per parameter: ``accum`` (TF's slot ``<var>/Ftrl``, starting at
    `initial_accumulator_value`) and ``linear`` (``<var>/Ftrl_1``, zeros). With
    ``p = -learning_rate_power`` and ``l2' = l2 + beta / (2 * lr)`` (TF's
    adjusted l2)::

        g'        = g + 2 * l2_shrinkage * w
        new_accum = accum + g^2
        linear   += g' - (new_accum^p - accum^p) / lr * w
        w         = (l1 * sign(linear) - linear) / (new_accum^p / lr + 2 * l2')
                    if |linear| > l1 else 0
        accum     = new_accum

    Arguments and their checks (and messages) are TF1's; those after
    `l2_regularization_strength` are keyword-only (TF1 has `use_locking` and
    `name` there). `lr=` is accepted for `learning_rate`.
    """

    def __init__(self, params: Iterable, learning_rate: Optional[float] = None,
                 learning_rate_power: float = -0.5, initial_accumulator_value: float = 0.1,
                 l1_regularization_strength: float = 0.0,
                 l2_regularization_strength: float = 0.0, *,
                 l2_shrinkage_regularization_strength: float = 0.0, beta: float = 0.0,
                 lr: Optional[float] = None):
        learning_rate = _learning_rate(learning_rate, lr, "Ftrl", zero=False)
        if initial_accumulator_value < 0.0:
            raise ValueError("initial_accumulator_value %f needs to be positive or zero"
                             % initial_accumulator_value)
        if learning_rate_power > 0.0:
            raise ValueError("learning_rate_power %f needs to be negative or zero"
                             % learning_rate_power)
        for name, value in (("l1_regularization_strength", l1_regularization_strength),
                            ("l2_regularization_strength", l2_regularization_strength),
                            ("l2_shrinkage_regularization_strength",
                             l2_shrinkage_regularization_strength)):
            if value < 0.0:
                raise ValueError("%s %f needs to be positive or zero" % (name, value))
        beta = 0.0 if beta is None else beta      # TF1's default is None, meaning 0
        defaults = dict(lr=learning_rate, learning_rate_power=learning_rate_power,
                        initial_accumulator_value=initial_accumulator_value,
                        l1_regularization_strength=l1_regularization_strength,
                        l2_regularization_strength=l2_regularization_strength,
                        l2_shrinkage_regularization_strength=l2_shrinkage_regularization_strength,
                        beta=beta)
        super().__init__(params, defaults)
        self._dense_is_sparse = {}   # {id(table): (bool, hyperparameters)} (_rows_matter)

    def _update(self, group: dict, w: torch.Tensor, g: torch.Tensor, state: dict) -> None:
        if not state:
            self._init_state(group, w, state)
        self._ftrl(group, w, g, state["accum"], state["linear"])

    def _init_state(self, group: dict, w: torch.Tensor, state: dict) -> None:
        state["accum"] = torch.full_like(w, group["initial_accumulator_value"],
                                         memory_format=torch.preserve_format)
        state["linear"] = torch.zeros_like(w, memory_format=torch.preserve_format)

    def _rows_matter(self, group: dict, w: torch.Tensor, state: dict) -> bool:
        """A row with a zero gradient is recomputed from its slots: to itself
        once stepped, while the hyperparameters stay and no `l2_shrinkage`
        shrinks it; to 0 before. Where every row not yet stepped is 0 (a
        linear model's table, from zeros), the dense step, cheaper for small
        tables, is the sparse apply until a hyperparameter changes (a
        decaying learning rate); not for a warm-started or an embedding
        table. Asked once a table (a host sync)."""
        if group["l2_shrinkage_regularization_strength"] > 0.0:
            return True
        settings = tuple(group[k] for k in ("lr", "learning_rate_power",
                                            "l1_regularization_strength",
                                            "l2_regularization_strength")) + (group.get("beta"),)
        known = self._dense_is_sparse.get(id(w))
        if known is None:
            if not state:
                self._init_state(group, w, state)
            never_stepped = state["linear"].eq(0).logical_and_(
                state["accum"].eq(group["initial_accumulator_value"]))
            known = self._dense_is_sparse[id(w)] = (
                not bool(w.ne(0).logical_and_(never_stepped).any()), settings)
        elif known[0] and known[1] != settings:   # (for good: stepped rows are of those)
            known = self._dense_is_sparse[id(w)] = (False, settings)
        return not known[0]

    @staticmethod
    def _ftrl(group: dict, w: torch.Tensor, g: torch.Tensor, accum: torch.Tensor,
              linear: torch.Tensor) -> None:
        """One step on `w` and its slots, in place."""
        f = _in_dtype(w.dtype)
        lr, power = group["lr"], group["learning_rate_power"]
        l1 = group["l1_regularization_strength"]
        l2 = group["l2_regularization_strength"]
        shrinkage = group["l2_shrinkage_regularization_strength"]
        beta = group.get("beta", 0.0)      # absent from states saved before it existed
        if beta:   # TF computes this in the variable's dtype
            l2 = f(f(l2) + f(f(beta) / f(2.0 * f(max(lr, 1e-36)))))

        def root(x):
            return x.sqrt() if power == -0.5 else x.pow(-power)

        delta = root(accum)                     # old accum^p
        accum.add_(g * g)                       # not addcmul_: TF rounds g^2 first
        new_root = root(accum)
        # delta = -(new^p - old^p) / lr * w + g', so linear += g' - (...) as in TF
        delta.sub_(new_root).div_(lr).mul_(w)
        # g' = (2 * l2_shrinkage) * w + g, in TF's rounding (add's alpha= may fuse)
        delta.add_(g if shrinkage <= 0.0 else torch.mul(w, 2.0 * shrinkage).add_(g))
        linear.add_(delta)
        quadratic = new_root.div_(lr).add_(2.0 * l2)
        # clamp(linear, -l1, l1) - linear is l1 * sign(linear) - linear where |linear| > l1
        x = torch.clamp(linear, -l1, l1, out=delta).sub_(linear).div_(quadratic)
        w.copy_(torch.where(linear.abs() > l1, x, 0.0))


class RMSProp(_PerParameter):
    """``tf.compat.v1.train.RMSPropOptimizer``; a sparse gradient, or a table
    whose lookups are noted (`looked_up`), updates the rows read alone (TF's
    ``SparseApplyRMSProp``).

    State per parameter: ``rms`` (TF's ``<var>/RMSProp``, ONES), ``momentum``
    (zeros; ``<var>/RMSProp_1``, or ``<var>/RMSProp_2`` when centered) and,
    when `centered`, ``mg`` (zeros; ``<var>/RMSProp_1``)::

        rms += (g^2 - rms) * (1 - decay)
        mg  += (g - mg) * (1 - decay)                                  (centered)
        mom  = momentum * mom + lr * g / sqrt(rms [- mg^2] + epsilon)
        w   -= mom

    Unlike ``torch.optim.RMSprop``: rms starts at one and epsilon is inside the
    root. TF1 checks no argument; here decay must be in [0, 1] and momentum,
    epsilon >= 0. `centered` is keyword-only; `lr=` is accepted for
    `learning_rate`.
    """

    def __init__(self, params: Iterable, learning_rate: Optional[float] = None,
                 decay: float = 0.9, momentum: float = 0.0, epsilon: float = 1e-10, *,
                 centered: bool = False, lr: Optional[float] = None):
        learning_rate = _learning_rate(learning_rate, lr, "RMSProp")
        if not 0.0 <= decay <= 1.0:
            raise ValueError(f"decay must be in [0, 1], got {decay}")
        if momentum < 0.0:
            raise ValueError(f"momentum must be >= 0, got {momentum}")
        if epsilon < 0.0:
            raise ValueError(f"epsilon must be >= 0, got {epsilon}")
        super().__init__(params, dict(lr=learning_rate, decay=decay, momentum=momentum,
                                      epsilon=epsilon, centered=bool(centered)))

    def _update(self, group: dict, w: torch.Tensor, g: torch.Tensor, state: dict) -> None:
        one_minus_decay = 1.0 - _in_dtype(w.dtype)(group["decay"])
        eps = group["epsilon"]
        if not state:
            self._init_state(group, w, state)
        rms, mom = state["rms"], state["momentum"]
        tmp = torch.mul(g, g).sub_(rms).mul_(one_minus_decay)
        rms.add_(tmp)
        if group["centered"]:
            mg = state["mg"]
            mg.add_(torch.sub(g, mg, out=tmp).mul_(one_minus_decay))
            torch.mul(mg, mg, out=tmp).neg_().add_(rms).add_(eps)   # (rms - mg^2) + eps
        else:
            torch.add(rms, eps, out=tmp)
        mom.mul_(group["momentum"]).add_(torch.mul(g, group["lr"]).div_(tmp.sqrt_()))
        w.sub_(mom)

    def _init_state(self, group: dict, w: torch.Tensor, state: dict) -> None:
        state["rms"] = torch.ones_like(w, memory_format=torch.preserve_format)
        state["momentum"] = torch.zeros_like(w, memory_format=torch.preserve_format)
        if group["centered"]:
            state["mg"] = torch.zeros_like(w, memory_format=torch.preserve_format)


class Adam(_PerParameter):
    """``tf.compat.v1.train.AdamOptimizer`` (kernel ``ApplyAdam``), TF1's rule
    exactly; a sparse gradient moves every row, as TF1's sparse apply decays
    every row's moments.

    State per parameter: ``m`` and ``v`` (TF's slots ``<var>/Adam`` and
    ``<var>/Adam_1``, zeros) and TF's ``beta1_power`` / ``beta2_power``
    (beta^t, kept as TF keeps them, in the variable's dtype)::

        alpha = lr * sqrt(1 - beta2^t) / (1 - beta1^t)
        m += (g - m) * (1 - beta1)
        v += (g^2 - v) * (1 - beta2)
        w -= alpha * m / (sqrt(v) + epsilon)

    ``torch.optim.Adam`` adds epsilon after the bias correction of sqrt(v), TF1
    before: with TF1's epsilon=1e-8 the two differ only where sqrt(v) is that
    small, but with the large epsilons TF programs pass (0.1, 1.0: TF's
    docstring suggests them for ImageNet) every step differs. Arguments are
    TF1's; `lr=` is accepted for `learning_rate` (and wins when given).
    """

    def __init__(self, params: Iterable, learning_rate: float = 0.001, beta1: float = 0.9,
                 beta2: float = 0.999, epsilon: float = 1e-8, *, lr: Optional[float] = None):
        learning_rate = _learning_rate(lr, learning_rate, "Adam")
        for name, beta in (("beta1", beta1), ("beta2", beta2)):
            if not 0.0 <= beta < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {beta}")
        if epsilon < 0.0:
            raise ValueError(f"epsilon must be >= 0, got {epsilon}")
        super().__init__(params, dict(lr=learning_rate, beta1=beta1, beta2=beta2,
                                      epsilon=epsilon))

    def _update(self, group: dict, w: torch.Tensor, g: torch.Tensor, state: dict) -> None:
        f = _in_dtype(w.dtype)
        beta1, beta2 = f(group["beta1"]), f(group["beta2"])
        if not state:
            state["m"] = torch.zeros_like(w, memory_format=torch.preserve_format)
            state["v"] = torch.zeros_like(w, memory_format=torch.preserve_format)
            state["beta1_power"], state["beta2_power"] = beta1, beta2
        m, v = state["m"], state["v"]
        # TF's arithmetic on the scalars, in the variable's dtype
        alpha = f(f(f(group["lr"]) * f(f(1.0 - state["beta2_power"]) ** 0.5))
                  / f(1.0 - state["beta1_power"]))
        m.add_(torch.sub(g, m).mul_(f(1.0 - beta1)))
        v.add_(torch.mul(g, g).sub_(v).mul_(f(1.0 - beta2)))
        w.sub_(torch.mul(m, alpha).div_(v.sqrt().add_(f(group["epsilon"]))))
        state["beta1_power"] = f(state["beta1_power"] * beta1)
        state["beta2_power"] = f(state["beta2_power"] * beta2)

    _rows_alone = False   # TF1's sparse apply of Adam decays every row's moments

    def _update_rows(self, group: dict, w: torch.Tensor, rows: torch.Tensor, g: torch.Tensor,
                     state: dict) -> None:
        """TF1's sparse Adam: every row's moments decay and every row moves
        (the rows not in `rows` with a zero gradient), as with a dense one."""
        self._update(group, w, torch.zeros_like(w).index_copy_(0, rows, g), state)


def _check_l1_l2(l1: float, l2: float) -> None:
    for name, value in (("l1_regularization_strength", l1), ("l2_regularization_strength", l2)):
        if value < 0.0:
            raise ValueError(f"{name} must be >= 0, got {value}")


def _shrinks(group: dict) -> bool:
    """Whether a proximal step moves a weight whose gradient is zero."""
    return group["l1_regularization_strength"] > 0 or group["l2_regularization_strength"] > 0


def _proximal_step(w: torch.Tensor, rate: torch.Tensor, rate_l1, rate_l2) -> None:
    """TF's proximal (FOBOS) step on `w`, which already holds ``w - rate * g``:
    ``sign(w) * max(|w| - rate_l1, 0) / (1 + rate_l2)`` (no L1 term when
    `rate_l1` is None)."""
    if rate_l1 is not None:
        shrunk = torch.sub(w.abs(), rate_l1).clamp_min_(0.0)
        w.sign_().mul_(shrunk)
    w.div_(rate_l2 + 1.0)


class ProximalAdagrad(_PerParameter):
    """``tf.compat.v1.train.ProximalAdagradOptimizer``; a sparse gradient, or
    a table whose lookups are noted (`looked_up`), updates the rows read alone.

    State per parameter: ``accumulator`` (TF's slot ``<var>/ProximalAdagrad``,
    starting at `initial_accumulator_value`)::

        accumulator += g^2
        rate = learning_rate / sqrt(accumulator)
        v    = w - rate * g
        w    = sign(v) * max(|v| - rate * l1, 0) / (1 + rate * l2)

    `lr=` is accepted for `learning_rate`; strengths must be >= 0.
    """

    def __init__(self, params: Iterable, learning_rate: Optional[float] = None,
                 initial_accumulator_value: float = 0.1,
                 l1_regularization_strength: float = 0.0,
                 l2_regularization_strength: float = 0.0, *, lr: Optional[float] = None):
        learning_rate = _learning_rate(learning_rate, lr, "ProximalAdagrad", zero=False)
        if not initial_accumulator_value > 0.0:
            raise ValueError(f"initial_accumulator_value must be positive: "
                             f"{initial_accumulator_value}")
        _check_l1_l2(l1_regularization_strength, l2_regularization_strength)
        super().__init__(params, dict(lr=learning_rate,
                                      initial_accumulator_value=initial_accumulator_value,
                                      l1_regularization_strength=l1_regularization_strength,
                                      l2_regularization_strength=l2_regularization_strength))

    def _update(self, group: dict, w: torch.Tensor, g: torch.Tensor, state: dict) -> None:
        f = _in_dtype(w.dtype)
        if not state:
            self._init_state(group, w, state)
        accumulator = state["accumulator"]
        accumulator.addcmul_(g, g)
        rate = accumulator.rsqrt().mul_(f(group["lr"]))
        w.sub_(torch.mul(g, rate))
        l1, l2 = group["l1_regularization_strength"], group["l2_regularization_strength"]
        _proximal_step(w, rate, rate * f(l1) if l1 > 0 else None, rate * f(l2))

    def _init_state(self, group: dict, w: torch.Tensor, state: dict) -> None:
        state["accumulator"] = torch.full_like(w, group["initial_accumulator_value"],
                                               memory_format=torch.preserve_format)

    def _rows_matter(self, group: dict, w: torch.Tensor, state: dict) -> bool:
        return _shrinks(group)


class ProximalGradientDescent(_PerParameter):
    """``tf.compat.v1.train.ProximalGradientDescentOptimizer`` (a sparse
    gradient, or a table whose lookups are noted, `looked_up`: the rows read
    alone); no state::

        v = w - learning_rate * g
        w = sign(v) * max(|v| - learning_rate * l1, 0) / (1 + learning_rate * l2)

    `lr=` is accepted for `learning_rate`; strengths must be >= 0.
    """

    def __init__(self, params: Iterable, learning_rate: Optional[float] = None,
                 l1_regularization_strength: float = 0.0,
                 l2_regularization_strength: float = 0.0, *, lr: Optional[float] = None):
        learning_rate = _learning_rate(learning_rate, lr, "ProximalGradientDescent")
        _check_l1_l2(l1_regularization_strength, l2_regularization_strength)
        super().__init__(params, dict(lr=learning_rate,
                                      l1_regularization_strength=l1_regularization_strength,
                                      l2_regularization_strength=l2_regularization_strength))

    def _update(self, group: dict, w: torch.Tensor, g: torch.Tensor, state: dict) -> None:
        f = _in_dtype(w.dtype)
        rate = f(group["lr"])
        l1, l2 = group["l1_regularization_strength"], group["l2_regularization_strength"]
        w.sub_(torch.mul(g, rate))
        _proximal_step(w, rate, f(rate * f(l1)) if l1 > 0 else None, f(f(l2) * rate))

    def _rows_matter(self, group: dict, w: torch.Tensor, state: dict) -> bool:
        return _shrinks(group)


class Momentum(_PerParameter):
    """``tf.compat.v1.train.MomentumOptimizer``, whose sparse apply (a sparse
    gradient, or a table whose lookups are noted, `looked_up`) updates the
    rows read alone, where ``torch.optim.SGD(momentum=...)`` moves every row
    of a table by its momentum::

        accum = momentum * accum + g
        w    -= learning_rate * accum   (use_nesterov: g * lr + accum * momentum * lr)

    State per parameter: ``momentum_buffer`` (TF's slot ``<var>/Momentum``,
    from zeros; torch's SGD's name). `use_nesterov` is keyword-only (TF1 has
    `use_locking` and `name` before it); `lr=` is accepted for `learning_rate`.
    """

    def __init__(self, params: Iterable, learning_rate: Optional[float] = None,
                 momentum: Optional[float] = None, *, use_nesterov: bool = False,
                 lr: Optional[float] = None):
        learning_rate = _learning_rate(learning_rate, lr, "Momentum")
        if momentum is None:
            raise TypeError("Momentum needs momentum")
        super().__init__(params, dict(lr=learning_rate, momentum=momentum,
                                      use_nesterov=use_nesterov))

    def _init_state(self, group: dict, w: torch.Tensor, state: dict) -> None:
        state["momentum_buffer"] = torch.zeros_like(w, memory_format=torch.preserve_format)

    def _update(self, group: dict, w: torch.Tensor, g: torch.Tensor, state: dict) -> None:
        if not state:
            self._init_state(group, w, state)
        f = _in_dtype(w.dtype)
        lr, momentum = f(group["lr"]), f(group["momentum"])
        accum = state["momentum_buffer"].mul_(momentum).add_(g)
        if group["use_nesterov"]:   # (TF's kernel's order: (accum * momentum) * lr)
            w.sub_(torch.mul(g, lr).add_(accum.mul(momentum).mul_(lr)))
        else:
            w.sub_(torch.mul(accum, lr))


def _adagrad(params, learning_rate):
    # TF1: accum += g^2; w -= lr * g / sqrt(accum), accum from 0.1. eps=0 is that
    # exactly (the accumulator never falls below 0.1).
    return torch.optim.Adagrad(params, lr=learning_rate, initial_accumulator_value=0.1,
                               eps=0.0)


OPTIMIZER_NAMES = {
    "Adagrad": _adagrad,
    "Adam": lambda params, learning_rate: Adam(params, learning_rate=learning_rate),
    "Ftrl": lambda params, learning_rate: Ftrl(params, learning_rate=learning_rate),
    "RMSProp": lambda params, learning_rate: RMSProp(params, learning_rate=learning_rate),
    "SGD": lambda params, learning_rate: torch.optim.SGD(params, lr=learning_rate),
}
"""TF1's canned optimizer names (``_OPTIMIZER_CLS_NAMES``) -> ``build(params, learning_rate)``."""


def optimizer_factory(optimizer, learning_rate: Optional[float]) -> Callable:
    """A canned estimator's ``optimizer=`` as ``factory(params) -> torch.optim.Optimizer``.

    `optimizer` is a TF1 name (exact case) built with `learning_rate` and TF1's
    defaults:

    - ``'Adagrad'``: ``torch.optim.Adagrad``, initial accumulator 0.1, eps 0
      (TF1's ``AdagradOptimizer``).
    - ``'Adam'``: `Adam` (``AdamOptimizer``'s rule: ``torch.optim.Adam`` adds
      epsilon after the bias correction, TF1 before, which moves small-gradient
      weights, embeddings from 0.01 say, by several percent a step).
    - ``'Ftrl'``: `Ftrl`; ``'RMSProp'``: `RMSProp`; ``'SGD'``: ``torch.optim.SGD``.

    Or a factory ``lambda params: torch.optim...``, returned as is (TF1 takes an
    optimizer or a callable returning one; here the estimator owns the
    parameters, so it calls the factory with them).
    """
    names = tuple(OPTIMIZER_NAMES)
    if isinstance(optimizer, str):
        build = OPTIMIZER_NAMES.get(optimizer)
        if build is None:
            lowered = {name.lower(): name for name in names}
            close = difflib.get_close_matches(optimizer.lower(), lowered, n=1, cutoff=0.5)
            hint = f"; did you mean {lowered[close[0]]!r}?" if close else ""
            raise ValueError(f"Unsupported optimizer name: {optimizer!r}. Supported names "
                             f"are: {names}{hint}")
        if not learning_rate:
            raise ValueError(f"learning_rate must be specified when optimizer is a name "
                             f"({optimizer!r}), got {learning_rate!r}")

        def factory(params):
            return build(params, learning_rate)
        factory.__qualname__ = f"optimizer_factory({optimizer!r}, {learning_rate!r})"
        return factory
    if isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be one of {names} or a factory `lambda params: "
                        f"torch.optim...`, not an optimizer instance ({optimizer!r}): the "
                        "canned estimator creates its parameters, so it builds the optimizer")
    if callable(optimizer):
        return optimizer
    raise TypeError(f"optimizer must be one of {names} or a factory `lambda params: "
                    f"torch.optim...`, got {optimizer!r}")
