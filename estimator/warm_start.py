"""Warm starting: initialise a new model from another run's checkpoint
(tf.estimator.WarmStartSettings).

Distinct from resuming: resuming restores everything (optimizer, global step)
from this `model_dir`; warm starting copies chosen module variables from
elsewhere and only when `model_dir` has no checkpoint yet.
"""
from __future__ import annotations

import collections
import collections.abc
import difflib
import json
import logging
import math
import os
import re
from typing import Callable, Dict, Optional, Sequence, Union

import torch
from torch.nn.parameter import is_lazy

from distribute.variable_names import var_name
from hooks import tf_checkpoint
from hooks.checkpoint import rounded_by_cast

from . import checkpoint
from .feature_column._vocabulary import read_vocabulary_file

logger = logging.getLogger(__name__)


class VocabInfo(collections.namedtuple("VocabInfo", [
        "new_vocab", "new_vocab_size", "num_oov_buckets", "old_vocab", "old_vocab_size",
        "backup_initializer", "axis"])):
    """How a variable indexed by a vocabulary moves to a new vocabulary
    (tf.estimator.VocabInfo): along `axis` (0: rows, as embeddings and linear
    weights; 1: columns, as a logits kernel over the label vocabulary), entry i
    of the first `new_vocab_size` lines of the file `new_vocab` takes the old
    variable's entry for the same line of `old_vocab` (its first
    `old_vocab_size` lines; -1: all); entries not in the old vocabulary and the
    `num_oov_buckets` OOV entries after them start as `backup_initializer`
    leaves them (called with the variable's shape; None: zeros, as TF). The
    axis is that of the variable as this framework names and shapes it: the
    canned estimators' variables are TF's."""

    def __new__(cls, new_vocab: str, new_vocab_size: int, num_oov_buckets: int,
                old_vocab: str, old_vocab_size: int = -1,
                backup_initializer: Optional[Callable] = None, axis: int = 0):
        if axis not in (0, 1):
            raise ValueError("The only supported values for the axis argument are 0 and 1.  "
                             f"Provided axis: {axis}")
        if not (new_vocab and new_vocab_size and old_vocab):
            raise ValueError("Invalid args: Must provide all of [new_vocab, new_vocab_size, "
                             f"old_vocab]; got {new_vocab!r}, {new_vocab_size!r}, "
                             f"{old_vocab!r}")
        if num_oov_buckets < 0:
            raise ValueError(f"num_oov_buckets must be >= 0, got {num_oov_buckets}")
        return super().__new__(cls, new_vocab, new_vocab_size, num_oov_buckets, old_vocab,
                               old_vocab_size, backup_initializer, axis)


def _remapped(old: torch.Tensor, info: VocabInfo, shape: tuple, name: str,
              prev: str) -> torch.Tensor:
    """`old` (the checkpoint's `prev`) remapped to the new vocabulary as `info`
    says, in `shape` (the variable `name`'s)."""
    what = f"Warm-start: VocabInfo of {name!r}"
    axis = info.axis
    if len(shape) <= axis or old.dim() != len(shape):
        raise ValueError(f"{what}: axis {axis} does not fit {name!r} of shape {shape} "
                         f"(and {prev!r} of shape {tuple(old.shape)})")
    if shape[axis] != info.new_vocab_size + info.num_oov_buckets:
        raise ValueError(f"{what}: {name!r} has {shape[axis]} entries along axis {axis}, but "
                         f"new_vocab_size {info.new_vocab_size} + num_oov_buckets "
                         f"{info.num_oov_buckets} = "
                         f"{info.new_vocab_size + info.num_oov_buckets}")
    other = [d for d in range(len(shape)) if d != axis]
    if [shape[d] for d in other] != [old.shape[d] for d in other]:
        raise ValueError(f"{what}: {name!r} has shape {shape} but {prev!r} has shape "
                         f"{tuple(old.shape)}: only axis {axis} may differ")
    new_vocab = read_vocabulary_file(info.new_vocab, name, info.new_vocab_size, True,
                                     what=f"{what}: new_vocab")
    old_vocab = read_vocabulary_file(info.old_vocab, name, None if info.old_vocab_size == -1
                                     else info.old_vocab_size, True, what=f"{what}: old_vocab")
    if len(old_vocab) > old.shape[axis]:
        raise ValueError(f"{what}: old_vocab lists {len(old_vocab)} entries but {prev!r} has "
                         f"{old.shape[axis]} along axis {axis}")
    where = {token: i for i, token in enumerate(old_vocab)}
    pairs = [(i, where[t]) for i, t in enumerate(new_vocab) if t in where]
    if info.backup_initializer is None:
        out = torch.zeros(shape, dtype=old.dtype)
    else:
        out = torch.as_tensor(info.backup_initializer(shape), dtype=old.dtype).clone()
        if tuple(out.shape) != tuple(shape):
            raise ValueError(f"{what}: backup_initializer({shape}) gave shape "
                             f"{tuple(out.shape)}")
    if pairs:
        new_ids, old_ids = (torch.tensor(ids) for ids in zip(*pairs))
        out.index_copy_(axis, new_ids, old.index_select(axis, old_ids))
    logger.info("Warm-started %s from %s: %d of %d vocabulary entries found in the old "
                "vocabulary", name, prev, len(pairs), len(new_vocab))
    return out


class WarmStartSettings:
    """Which variables to warm-start from which checkpoint.

    - `ckpt_to_initialize_from`: a checkpoint file or a model_dir (its latest);
      or a TensorFlow checkpoint (a prefix, or a TF model_dir): a canned
      estimator with the same columns takes TF1's variables by their names;
      for your own modules map names with `var_name_to_prev_var_name`
      ({"net/0/weight": "dense/kernel"}); the weight of a `torch.nn.Linear`
      or convolution takes TF's kernel [in, out] ([h, w, in, out]) in
      torch's layout [out, in] ([out, in, h, w]); another module's variable
      takes a TF `kernel` so where only that layout fits its shape.
    - `vars_to_warm_start`: a regex (matched from the start, as TF), default
      every trainable variable (TF's TRAINABLE_VARIABLES: parameters that
      require grad; not buffers such as batch norm's moving statistics); or
      a list of them (names such as `"net/0/weight"` match themselves),
      which reaches every variable, buffers and `global_step` too (the run
      then starts at the checkpoint's step), as in TF, and a TF checkpoint's
      optimizer slots into the state of torch's Adagrad (`<var>/Adagrad`),
      Adam (`<var>/Adam`, `<var>/Adam_1`, with `beta1_power`) and SGD with
      momentum (`<var>/Momentum`), and of `est.optimizers`' `Ftrl`, `Adam`,
      `RMSProp` (`<var>/RMSProp`, `_1`, `_2` when centered), `Momentum` and
      `ProximalAdagrad`;
      other optimizers' state starts fresh (a warning names TF slots left
      so); from this library's checkpoints, an optimizer of the same kind
      takes its variables' whole state (a list warm start of `[".*"]` from a
      checkpoint of the same model continues as a resumed run).
    Every selected variable must be in the checkpoint (TF's ValueError).
    - `var_name_to_vocab_info`: {name: VocabInfo} for variables whose
      vocabulary changed (warm-started even when `vars_to_warm_start` is None).
    - `var_name_to_prev_var_name`: {new name: name in the old checkpoint}.
    As in TF, an entry of the two dicts that names no warm-started variable is
    an error once the model is built.
    """

    def __init__(self, ckpt_to_initialize_from: str,
                 vars_to_warm_start: Union[str, Sequence[str], None] = ".*",
                 var_name_to_vocab_info: Optional[Dict[str, VocabInfo]] = None,
                 var_name_to_prev_var_name: Optional[Dict[str, str]] = None):
        if not ckpt_to_initialize_from:
            raise ValueError("WarmStartSettings: ckpt_to_initialize_from must be a "
                             "checkpoint path or directory")
        for name, info in (var_name_to_vocab_info or {}).items():
            if not isinstance(info, VocabInfo):
                raise TypeError(f"WarmStartSettings: var_name_to_vocab_info[{name!r}] must be "
                                f"a VocabInfo, got {type(info).__name__}")
        self.ckpt_to_initialize_from = ckpt_to_initialize_from
        self.vars_to_warm_start = vars_to_warm_start
        self.var_name_to_vocab_info = dict(var_name_to_vocab_info or {})
        self.var_name_to_prev_var_name = dict(var_name_to_prev_var_name or {})

    def __repr__(self):
        return (f"WarmStartSettings(ckpt_to_initialize_from={self.ckpt_to_initialize_from!r}, "
                f"vars_to_warm_start={self.vars_to_warm_start!r})")


def _settings(warm_start_from) -> Optional[WarmStartSettings]:
    if warm_start_from is None or isinstance(warm_start_from, WarmStartSettings):
        return warm_start_from
    if isinstance(warm_start_from, (str, bytes, os.PathLike)):
        return WarmStartSettings(os.fsdecode(warm_start_from))
    raise TypeError("warm_start_from must be a checkpoint path, a model_dir, a TF "
                    f"SavedModel directory or WarmStartSettings, got "
                    f"{type(warm_start_from).__name__}")


def _slot_names(optimizer) -> Dict[str, str]:
    """{our state key: TF's slot name} of the optimizers whose state TF's
    slots make: torch's Adagrad, Adam and SGD with momentum, and this
    library's Ftrl, Adam, RMSProp, Momentum and ProximalAdagrad (TF1's rules)."""
    from . import optimizers   # (a sibling module; imported here to keep this one light)
    if isinstance(optimizer, torch.optim.Adagrad):
        return {"sum": "Adagrad"}
    if isinstance(optimizer, optimizers.Ftrl):
        return {"accum": "Ftrl", "linear": "Ftrl_1"}
    if isinstance(optimizer, optimizers.Adam):
        return {"m": "Adam", "v": "Adam_1"}
    if isinstance(optimizer, optimizers.RMSProp):   # (TF makes mg before momentum)
        centered = {g["centered"] for g in optimizer.param_groups}
        return {} if len(centered) > 1 else {"rms": "RMSProp", "mg": "RMSProp_1",
                                             "momentum": "RMSProp_2"} if centered.pop() else \
            {"rms": "RMSProp", "momentum": "RMSProp_1"}
    if isinstance(optimizer, optimizers.ProximalAdagrad):
        return {"accumulator": "ProximalAdagrad"}
    if type(optimizer) is torch.optim.Adam:
        return {"exp_avg": "Adam", "exp_avg_sq": "Adam_1"}
    if isinstance(optimizer, optimizers.Momentum) or isinstance(optimizer, torch.optim.SGD) and \
            all(g["momentum"] and not g["dampening"] for g in optimizer.param_groups):
        return {"momentum_buffer": "Momentum"}
    return {}


def _fill_state(optimizer, group: dict, param: torch.Tensor, state: dict, powers: list) -> None:
    """The rest of a state whose slots TF's made: Adam's powers of beta (TF's
    `beta1_power`, `beta2_power` after t steps: beta^(t + 1)), as this
    library's Adam keeps them or as torch's step; `powers`, the checkpoint's
    pairs, of which the one this group's betas make (none: a fresh optimizer's)."""
    from . import optimizers
    if isinstance(optimizer, optimizers.Adam):
        betas = group["beta1"], group["beta2"]
    elif isinstance(optimizer, torch.optim.Adam):
        betas = group["betas"]
    else:
        return
    pair, steps = _powers_of(betas, powers)
    if isinstance(optimizer, optimizers.Adam):
        f = optimizers._in_dtype(param.dtype)
        state["beta1_power"], state["beta2_power"] = (f(x) for x in (pair or betas))
        return
    on_device = group.get("capturable") or group.get("fused")
    state["step"] = torch.tensor(float(steps), dtype=torch.float64 if torch.get_default_dtype()
                                 == torch.float64 else torch.float32,
                                 device=param.device if on_device else "cpu")
    if group.get("amsgrad"):
        state["max_exp_avg_sq"] = state["exp_avg_sq"].clone()


def _load_states(optimizer, states: dict) -> None:
    """Put {index of a parameter, in param_groups' order: its state} into
    `optimizer` by its load_state_dict: torch's casts to each parameter's
    device and dtype, and a strategy's hook (ParameterServerStrategy's puts
    the state on the ps tasks; set in `optimizer.state` it stayed here, and
    the ps tasks' Adam started fresh)."""
    if states:
        state_dict = optimizer.state_dict()
        state_dict["state"].update(states)
        optimizer.load_state_dict(state_dict)


def _group_keys(groups: list) -> set:
    """The hyperparameter names of an optimizer's param groups: the same for
    one kind of optimizer (Adam's `betas`, SGD's `momentum`, ...)."""
    return {tuple(sorted(set(g) - {"params", "initial_lr"})) for g in groups}


def _same_settings(saved: set, keys: set, kind: Optional[str], optimizer) -> bool:
    """Whether a checkpoint's optimizer, of hyperparameter names `saved` (and
    class `kind`, where recorded), is of `optimizer`'s kind (names `keys`): the
    same names, or fewer where it is of the same class, or of one unrecorded,
    and the class has gained a setting since (est.optimizers.Ftrl's `beta`,
    a torch release's new flag)."""
    if saved == keys:
        return True
    if kind is not None and kind != checkpoint.optimizer_kind(optimizer):
        return False
    return all(any(set(s) <= set(k) for k in keys) for s in saved)


def _powers_of(betas: tuple, powers: list) -> tuple:
    """(the pair of `powers` that `betas` raised to one number of steps make,
    that number of completed steps), or (None, 0). The count comes from
    beta2's power where it can (beta1^t underflows to 0 in float32 past ~980
    steps); a checkpoint of two Adams with other betas (`beta1_power_1`) has
    one pair per optimizer."""
    def steps(pair):
        counts = [math.log(p) / math.log(b) for p, b in zip(pair, betas)
                  if 0 < p < 1 and 0 < b < 1]
        if not counts:
            return None, math.inf
        exponent = counts[-1]   # (beta2's, the exact one, when there)
        misfit = abs(exponent - round(exponent)) + sum(abs(c - exponent) for c in counts)
        return max(0, round(exponent) - 1), misfit
    scored = [(steps(pair), pair) for pair in powers]
    scored = [((n, misfit), pair) for (n, misfit), pair in scored if n is not None]
    if not scored:
        return None, 0
    (n, _), pair = min(scored, key=lambda item: item[0][1])
    return pair, n


# Torch's layers whose weight is [out, in, *spatial] where TF's kernel is
# [*spatial, in, out] (TF's transposed convolutions: [*spatial, out, in], as
# torch's [in, out, *spatial]: the same permutation).
_TORCH_LAYOUT_LAYERS = (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d,
                        torch.nn.ConvTranspose1d, torch.nn.ConvTranspose2d,
                        torch.nn.ConvTranspose3d)


def _layer_weights(module: torch.nn.Module) -> dict:
    """{state-dict key: layer} of `module`'s torch.nn.Linear and convolution
    weights, and its recurrent layers' weights and biases."""
    out = {}
    for prefix, layer in module.named_modules():
        if isinstance(layer, _TORCH_LAYOUT_LAYERS):
            out[f"{prefix}.weight" if prefix else "weight"] = layer
        elif isinstance(layer, (torch.nn.RNNBase, torch.nn.RNNCellBase)):
            out.update((f"{prefix}.{key}" if prefix else key, layer)
                       for key, _ in layer.named_parameters(recurse=False))
    return out


def _depthwise(layer: Optional[torch.nn.Module], value: torch.Tensor) -> bool:
    """Whether `value` is TF's depthwise kernel [*spatial, in, multiplier]
    (`tf.nn.depthwise_conv2d`, `DepthwiseConv2D`: MobileNet's, EfficientNet's)
    for `layer`, a convolution with one group per input channel (TF2's
    `Conv2D(groups=in)` kernel [*spatial, 1, out] is an ordinary one)."""
    groups = getattr(layer, "groups", 1)
    return (groups > 1 and not layer.transposed and groups == layer.in_channels
            and value.shape[-2] == groups)


def _torch_layout(value: torch.Tensor, shape: tuple, name: str,
                  layer: Optional[torch.nn.Module], key: str = "") -> torch.Tensor:
    """A TF kernel [*spatial, in, out] in torch's layout [out, in, *spatial]
    (a depthwise kernel [*spatial, in, multiplier]: [in * multiplier, 1, *spatial]).

    A torch.nn.Linear or convolution weight (its `layer` given) always takes
    it so, whatever the TF variable's name (`kernel`, TF-slim's `weights`):
    the layer says, where shapes cannot (a square dense kernel; a 3x3 kernel
    from 3 to 3 channels). Another module's variable takes it only from a TF
    `kernel` whose shape matches the target's only so. A recurrent layer's
    (its state-dict `key`): see `_recurrent_layout`."""
    if isinstance(layer, (torch.nn.RNNBase, torch.nn.RNNCellBase)):
        return _recurrent_layout(value, shape, name, layer, key)
    if value.dim() < 2 or value.dim() != len(shape):
        return value
    spatial = range(value.dim() - 2)
    if layer is not None and _depthwise(layer, value):
        return value.reshape(*value.shape[:-2], -1).permute(-1, *spatial).unsqueeze(1)
    permuted = value.permute(value.dim() - 1, value.dim() - 2, *spatial)
    if layer is not None:
        return permuted
    if name.endswith("kernel") and tuple(value.shape) != shape and \
            tuple(permuted.shape) == shape:
        return permuted
    return value


def _recurrent_layout(value: torch.Tensor, shape: tuple, name: str, layer: torch.nn.Module,
                      key: str) -> torch.Tensor:
    """Keras's LSTM, GRU or SimpleRNN (or cell) variable `value` for the
    torch.nn.LSTM, GRU or RNN (or cell) weight or bias `key`: a kernel [in,
    gates * units] (always transposed: a square one too), gates in torch's
    order (Keras's GRU z, r, h is torch's r, z, n; its LSTM's i, f, c, o is
    torch's), a GRU's bias [2, 3 * units] (`reset_after=True`, TF 2's)
    split: row 0 for `bias_ih`, row 1 for `bias_hh`; another kernel (TF1's
    LSTMCell projection for `weight_hr`) transposed. TF1's LSTMCell (one
    kernel over [input, state]): `est.checkpoint.lstm_from_tf`."""
    if name.rsplit("/", 1)[-1] not in ("kernel", "recurrent_kernel", "bias"):
        return value   # (not Keras' or TF1's names: a layout of another's)
    gru = isinstance(layer, (torch.nn.GRU, torch.nn.GRUCell))
    gates = 4 if isinstance(layer, (torch.nn.LSTM, torch.nn.LSTMCell)) else 3 if gru else 1
    units = layer.hidden_size
    order = (torch.cat([torch.arange(units, 2 * units), torch.arange(units),
                        torch.arange(2 * units, 3 * units)]) if gru else None)
    bias = key.rsplit(".", 1)[-1].startswith("bias")
    if bias and value.dim() == 1 and value.shape[0] == gates * units:
        if gru:
            raise ValueError(
                f"Warm-start: {name!r} is a GRU bias of one row, Keras's GRU with "
                f"reset_after=False (TF 1's), whose candidate applies the reset gate before "
                f"the recurrent kernel: torch.nn.GRU cannot compute it")
        if "bias_hh" in key:
            raise ValueError(
                f"Warm-start: {name!r} is the recurrent layer's one bias: map it to bias_ih "
                f"and leave bias_hh at zero (frozen), or the bias is counted twice")
        return value
    if bias and gru and tuple(value.shape) == (2, 3 * units):
        return value[1 if "bias_hh" in key else 0][order]
    if not bias and value.dim() == 2 and value.shape[1] == gates * units and "weight_hr" not in key:
        return (value if order is None else value[:, order]).t()
    if not bias and value.dim() == 2 and tuple(value.shape) != shape \
            and tuple(value.shape[::-1]) == shape:
        return value.t()
    return value


class _TFVariables(collections.abc.Mapping):
    """A TF checkpoint's variables as {name: tensor}, each read when asked for."""

    def __init__(self, reader):
        self._reader = reader
        self._names = list(reader.variables())

    def __getitem__(self, name):
        return torch.from_numpy(self._reader.tensor(name).copy())

    def __contains__(self, name):
        return name in self._reader

    def __iter__(self):
        return iter(self._names)

    def __len__(self):
        return len(self._names)


def _tf_prefix(path: str) -> Optional[str]:
    """The TF checkpoint `path` names: a prefix, a model_dir, or a SavedModel
    directory (its variables/variables, as TF's Estimator takes a
    `warm_start_from` naming one); None where it names none."""
    variables = os.path.join(path, "variables", "variables")
    if os.path.isfile(variables + ".index"):
        logger.info("Warm-starting from a SavedModel")
        return variables
    return tf_checkpoint.find_prefix(path)


def _exported(path: str) -> str:
    """What to say where `path` is an export of this library (no checkpoint in it)."""
    try:
        with open(os.path.join(path, "signature.json"), encoding="utf-8") as f:
            step = json.load(f).get("global_step")
    except (OSError, ValueError, AttributeError):
        return ""
    return (f"; it is an export (model.pt2), which holds no checkpoint: warm-start from the "
            f"model_dir it was exported from (its checkpoint of step {step})")


class _WarmStarter:
    """Applies WarmStartSettings to each module as the model scope creates it."""

    def __init__(self, settings: WarmStartSettings):
        prefix = _tf_prefix(settings.ckpt_to_initialize_from)
        if prefix is not None:   # a TF1/TF2 checkpoint: variables read as needed
            self.path = prefix
            self._variables = _TFVariables(tf_checkpoint.TFCheckpointReader(prefix))
        else:
            try:
                self.path = checkpoint.resolve(settings.ckpt_to_initialize_from)
            except ValueError as e:
                raise ValueError(f"warm_start_from: {e}" + _exported(
                    settings.ckpt_to_initialize_from)) from None
            self._state = checkpoint.load(self.path)
            self._variables = checkpoint.flat_variables(self._state)
        self._settings = settings
        self._names = []              # every module variable offered, in order
        self._renamed, self._remapped = set(), set()
        # {warm-started variable: (its checkpoint name, its layout of a value of that name)}
        self._layouts: Dict[str, tuple] = {}
        self._started = 0             # module variables warm-started
        self._slots_left: list = []   # [(TF slots not warm-started, into which optimizer)]
        logger.info("Warm-starting from %s", self.path)

    def global_step(self) -> Optional[int]:
        """The step a warm-started run starts from: the checkpoint's when
        `vars_to_warm_start` is a list reaching `global_step` (TF's list form
        takes every global variable, the step included), else None (0)."""
        patterns = self._settings.vars_to_warm_start
        if not isinstance(patterns, (list, tuple)) or "global_step" not in self._variables:
            return None
        if not any(re.match(p, "global_step") for p in patterns):
            return None
        step = int(self._variables["global_step"].reshape(-1)[0])
        logger.info("Warm-started global_step from %s: %d", self.path, step)
        return step

    def check_used(self) -> None:
        """TF's check, once the model is built: every renaming and VocabInfo
        names a warm-started variable. And a warning where nothing was
        warm-started (TF logs "Warm-started 0 variables"): a pattern that
        matches no variable, often a scope named as TF named it."""
        if self._started == 0 and self._names and self._settings.vars_to_warm_start is not None:
            logger.warning("Warm-start: vars_to_warm_start %r matched none of the model's "
                           "variables, so none was warm-started from %s; the variables are "
                           "%s", self._settings.vars_to_warm_start, self.path,
                           self._names[:20] + (["..."] if len(self._names) > 20 else []))
        taken = {prev for prev, _ in self._layouts.values()}   # (a moving average's, say)
        for left, kind in self._slots_left:
            left = [n for n in left if n not in taken]
            if left:
                logger.warning(
                    "Warm-start: the checkpoint's optimizer slots %s%s are not warm-started "
                    "into %s, whose state starts fresh (TF's list warm start restores them; "
                    "slots are taken by torch's Adagrad, Adam and SGD with momentum, and "
                    "est.optimizers' Adam, Ftrl, RMSProp, Momentum and ProximalAdagrad)",
                    left[:4], " ..." if len(left) > 4 else "", kind)
        self._slots_left.clear()
        for what, given, used in (
                ("var_name_to_prev_var_name", self._settings.var_name_to_prev_var_name,
                 self._renamed),
                ("var_name_to_vocab_info", self._settings.var_name_to_vocab_info,
                 self._remapped)):
            unused = sorted(set(given) - used)
            if unused:
                raise ValueError(f"You provided the following variables in {what} that were "
                                 f"not used: {unused}. Perhaps you misspelled them, or "
                                 "vars_to_warm_start leaves them out (a regex reaches "
                                 "trainable variables only, a list every variable)? Here is "
                                 f"the list of viable variable names: {self._names}")

    def apply_optimizer(self, optimizer: torch.optim.Optimizer, var_names: Sequence[str],
                        name: str = "optimizer"):
        """Optimizer slots of the warm-started variables, when
        `vars_to_warm_start` is a list naming them (as in TF, where only the
        list option reaches non-trainable variables), in the layout their
        variable took: `<var>/Adagrad` (also `<var>/t_0/Adagrad`,
        `<var>/part_0/...`) Adagrad's `sum`; `<var>/Ftrl`, `<var>/Ftrl_1`
        Ftrl's `accum`, `linear`; `<var>/Adam`, `<var>/Adam_1` Adam's moments
        (with `beta1_power`, `beta2_power`); `<var>/Momentum` SGD's momentum
        buffer. Slots another optimizer cannot take are said in a warning.
        From this library's checkpoints, see `_apply_own_slots`."""
        patterns = self._settings.vars_to_warm_start
        if not isinstance(patterns, (list, tuple)):
            return
        if not isinstance(self._variables, _TFVariables):
            self._apply_own_slots(optimizer, var_names, name)
            return
        slots = _slot_names(optimizer)
        powers = [(float(self._variables[a]), float(self._variables[b]))
                  for a, b in self._power_names() if all(any(re.match(p, n) for p in patterns)
                                                         for n in (a, b))]
        groups = [(group, p) for group in optimizer.param_groups for p in group["params"]]
        left, states = [], {}
        with torch.no_grad():
            for index, ((group, param), var) in enumerate(zip(groups, var_names)):
                if var not in self._layouts:
                    continue   # (not warm-started itself)
                prev_var, layout = self._layouts[var]
                taken = {}
                for slot, tf_slot in slots.items():
                    found = [f"{prev_var}/{middle}{tf_slot}" for middle in ("", "t_0/", "part_0/")
                             if f"{prev_var}/{middle}{tf_slot}" in self._variables]
                    if found and any(re.match(p, found[0]) for p in patterns):
                        taken[slot] = found[0]
                left += [n for n in self._slots_of(prev_var) if n not in taken.values()
                         and any(re.match(p, n) for p in patterns)]
                if not taken:
                    continue
                state = states[index] = dict(optimizer.state.get(param, {}))   # (Adagrad's)
                for slot, name in taken.items():
                    value = layout(self._variables[name])
                    if tuple(value.shape) != tuple(param.shape):
                        raise ValueError(f"Warm-start: slot {name!r} has shape "
                                         f"{tuple(value.shape)}, {var!r} {tuple(param.shape)}")
                    state[slot] = value.to(param.device, param.dtype).clone()
                    logger.info("Warm-started %s's %s from %s", var, slot, name)
                _fill_state(optimizer, group, param, state, powers)
        _load_states(optimizer, states)
        if left:   # (said once the model is built: `check_used`)
            self._slots_left.append((left, type(optimizer).__name__))

    def _apply_own_slots(self, optimizer, var_names: Sequence[str], name: str) -> None:
        """A list warm start from this library's checkpoint: each warm-started
        variable's state (Adam's moments and step, a momentum buffer, ...,
        `<var>/<slot>` in TF's naming, `<optimizer>/<var>/<slot>` as
        list_variables names them) from the checkpoint's optimizer of this
        one's name, else of another holding that variable, when it is of the
        same kind (the same hyperparameter keys, and the state this one
        keeps); else a warning."""
        patterns = self._settings.vars_to_warm_start
        keys = _group_keys(optimizer.param_groups)
        owners = sorted(self._state.get("optimizers", {}), key=lambda owner: owner != name)
        params = [p for group in optimizer.param_groups for p in group["params"]]
        states, left = {}, []
        for index, var in enumerate(var_names):
            if var not in self._layouts:
                continue   # (not warm-started itself)
            prev_var = self._layouts[var][0]
            for owner in owners:
                saved = self._state["optimizers"][owner]
                names = self._state.get("optimizer_var_names", {}).get(owner, [])
                if prev_var not in names or names.index(prev_var) not in saved.get("state", {}):
                    continue
                slots = saved["state"][names.index(prev_var)]
                wanted = [slot for slot in slots if any(
                    re.match(p, f"{prev_var}/{slot}") or re.match(p, f"{owner}/{prev_var}/{slot}")
                    for p in patterns)]
                if not wanted:
                    break
                kind = self._state.get("optimizer_kinds", {}).get(owner)
                same = _same_settings(_group_keys(saved["param_groups"]), keys, kind, optimizer)
                if not same or len(wanted) < len(slots) or \
                        checkpoint.missing_slots(optimizer, saved, kind):
                    left += [f"{owner}/{prev_var}/{slot}" for slot in wanted]
                    break
                shape = tuple(params[index].shape)
                for slot, value in slots.items():
                    if isinstance(value, torch.Tensor) and value.dim() and \
                            tuple(value.shape) != shape:
                        raise ValueError(f"Warm-start: slot {owner}/{prev_var}/{slot} has shape "
                                         f"{tuple(value.shape)}, {var!r} {shape}")
                states[index] = {slot: value.clone() if isinstance(value, torch.Tensor)
                                 else value for slot, value in slots.items()}
                logger.info("Warm-started %s's %s from %s", var, ", ".join(slots),
                            f"{owner}/{prev_var}")
                break
        _load_states(optimizer, states)
        if left:
            logger.warning(
                "Warm-start: the checkpoint's optimizer state %s%s is not warm-started into "
                "%s, whose state starts fresh: it is another kind of optimizer's (other "
                "hyperparameters, or other state), or vars_to_warm_start selects "
                "only some of a variable's state (taken whole or not at all)", left[:4],
                " ..." if len(left) > 4 else "", type(optimizer).__name__)

    def _power_names(self) -> list:
        """[(beta1_power, beta2_power)] names of the TF checkpoint's Adam
        optimizers (a graph's second Adam has `beta1_power_1`, ...)."""
        if not isinstance(self._variables, _TFVariables):
            return []
        return [(n, n.replace("beta1_power", "beta2_power")) for n in self._variables
                if re.fullmatch(r"(.*/)?beta1_power(_\d+)?", n)
                and n.replace("beta1_power", "beta2_power") in self._variables]

    def _slots_of(self, prev_var: str) -> list:
        """The TF checkpoint's variables under `prev_var/` (its slots), but its partitions."""
        if not isinstance(self._variables, _TFVariables):
            return []
        return [n for n in self._variables if n.startswith(prev_var + "/")
                and not re.fullmatch(r"part_\d+", n[len(prev_var) + 1:])]

    def _layout(self, shape: tuple, prev: str, layer: Optional[torch.nn.Module],
                key: str = "") -> Callable:
        """How a value of checkpoint variable `prev` (or a slot of it) becomes
        one of `shape` (`layer`'s weight `key`): TF's kernels in torch's
        layout; ours as they are."""
        if not isinstance(self._variables, _TFVariables):
            return lambda value: value
        return lambda value: _torch_layout(value, shape, prev, layer, key)

    def _wanted(self, name: str) -> bool:
        patterns = self._settings.vars_to_warm_start
        if patterns is None:
            return False
        if isinstance(patterns, str):
            return re.match(patterns, name) is not None
        return any(re.match(p, name) for p in patterns)   # TF: a list of regex scopes

    def apply(self, owner: str, module: torch.nn.Module) -> None:
        settings = self._settings
        layer_weights = _layer_weights(module) if isinstance(self._variables, _TFVariables) \
            else {}
        # A regex (or None) reaches trainable variables only, as TF's
        # TRAINABLE_VARIABLES: not buffers (batch norm's moving statistics),
        # not frozen parameters; a list reaches every variable.
        trainable = None if isinstance(settings.vars_to_warm_start, (list, tuple)) else {
            key for key, p in module.named_parameters(remove_duplicate=False) if p.requires_grad}
        items = module.state_dict(keep_vars=True).items()
        lazy = [(prefix, sub) for prefix, sub in module.named_modules()
                if isinstance(sub, torch.nn.modules.lazy.LazyModuleMixin)
                and sub.has_uninitialized_params()]
        for prefix, sub in lazy:   # (LazyLinear: its shapes come with the first batch)
            self._after_shapes_are_known(owner, prefix, sub, layer_weights, trainable)
        self._apply(owner, [(k, t) for k, t in items if not is_lazy(t)], layer_weights,
                    trainable)

    def _after_shapes_are_known(self, owner, prefix, sub, layer_weights, trainable) -> None:
        """Warm-start lazy module `sub` (at `prefix` in `owner`) once its first
        input has made its parameters, before it computes with them: a forward
        pre-hook after the one by which torch makes them."""
        def hook(module, args):
            handle.remove()
            keys = [(f"{prefix}.{k}" if prefix else k, t)
                    for k, t in module.state_dict(keep_vars=True).items()]
            self._apply(owner, keys, layer_weights, trainable)
        handle = sub.register_forward_pre_hook(hook)

    def apply_slot(self, variable: str, slot: str, tensor: torch.Tensor) -> None:
        """A slot of a variable (a moving average, `<variable>/<slot>`), as the
        model scope makes it: warm-started where `vars_to_warm_start` is a list
        reaching it (TF's list form takes every global variable; a regex, the
        trainable ones), from `<its variable's checkpoint name>/<slot>`, in
        its variable's layout."""
        name = f"{variable}/{slot}"
        if not isinstance(self._settings.vars_to_warm_start, (list, tuple)) or \
                not self._wanted(name):
            return
        prev_var, layout = self._layouts.get(variable, (variable, None))
        self._apply(variable, [(slot, tensor)], {}, None, slot_of=(prev_var, layout))

    def _refuse_tf1_cell_bias(self, prev: str, layer, key: str, name: str) -> None:
        """A TF1 LSTM cell's bias (BasicLSTMCell, LSTMCell, LSTMBlockCell: gates
        i, j, f, o, the forget bias added in the cell) fits a torch LSTM's bias
        by shape but not by layout; its cell is told from Keras's LSTM (gates
        i, f, c, o, as torch's) by a kernel beside it without a recurrent one."""
        if not (isinstance(layer, (torch.nn.LSTM, torch.nn.LSTMCell)) and ".bias" in f".{key}"
                and prev.endswith("/bias") and isinstance(self._variables, _TFVariables)):
            return
        cell = prev[:-len("/bias")]
        if f"{cell}/kernel" in self._variables and f"{cell}/recurrent_kernel" not in \
                self._variables:
            raise ValueError(
                f"Warm-start: {prev!r} (for {name!r}) is a TF1 LSTM cell's bias: its gates are "
                f"i, j, f, o and the cell adds forget_bias (1.0) to f, where torch's are i, f, "
                f"g, o with two biases; est.checkpoint.lstm_from_tf(kernel, bias) gives the "
                f"torch.nn.LSTM's weights and biases from the cell's {cell}/kernel and bias "
                f"(load them in the module's factory, and leave them out of the warm start)")

    def _apply(self, owner: str, items, layer_weights: dict, trainable,
               slot_of: Optional[tuple] = None) -> None:
        """`slot_of`: (the checkpoint name, the layout) of the variable whose
        slots `items` are."""
        settings = self._settings
        with torch.no_grad():
            for key, tensor in items:
                if trainable is not None and key not in trainable:
                    continue
                if key.endswith("num_batches_tracked") and isinstance(self._variables,
                                                                      _TFVariables):
                    continue   # (torch's batch counter: no TF variable holds one)
                name = var_name(owner, key)
                self._names.append(name)
                info = settings.var_name_to_vocab_info.get(name)
                if not self._wanted(name) and not (
                        info is not None and settings.vars_to_warm_start is None):
                    continue
                prev = settings.var_name_to_prev_var_name.get(
                    name, name if slot_of is None else f"{slot_of[0]}/{key}")
                if name in settings.var_name_to_prev_var_name:
                    self._renamed.add(name)
                if prev not in self._variables:
                    # TF's error, whatever selected the variable (a regex, the
                    # default ".*" included, or a list): a warm start never
                    # leaves a variable it was asked for at its initial value.
                    close = difflib.get_close_matches(prev, list(self._variables), n=3,
                                                      cutoff=0.5)
                    raise ValueError(
                        f"Warm-start: tensor {prev!r} (for {name!r}) is not found in checkpoint "
                        f"{self.path}" + (f"; the closest names: {close}" if close else "") +
                        "; leave the variable out of vars_to_warm_start or map it to a "
                        "checkpoint name in var_name_to_prev_var_name")
                value = stored = self._variables[prev]
                self._refuse_tf1_cell_bias(prev, layer_weights.get(key), key, name)
                if info is not None:
                    value = _remapped(value, info, tuple(tensor.shape), name, prev)
                    self._remapped.add(name)
                else:
                    layout = slot_of[1] if slot_of is not None else None
                    self._layouts[name] = (prev, layout or self._layout(
                        tuple(tensor.shape), prev, layer_weights.get(key), key))
                    value = self._layouts[name][1](value)
                if tuple(value.shape) != tuple(tensor.shape):
                    moved = (f" ({tuple(value.shape)} in torch's layout)"
                             if value.shape != stored.shape else "")
                    cell = (" (TF1's LSTMCell keeps one kernel over [input, state]: "
                            "est.checkpoint.lstm_from_tf gives a torch.nn.LSTM's weights)"
                            if isinstance(layer_weights.get(key), torch.nn.LSTM)
                            and "weight_ih" in key and prev.endswith("kernel") else "")
                    raise ValueError(f"Warm-start: {name!r} has shape {tuple(tensor.shape)} but "
                                     f"{prev!r} in {self.path} has shape "
                                     f"{tuple(stored.shape)}{moved}{cell}")
                if rounded_by_cast(value, tensor.dtype):
                    raise ValueError(
                        f"Warm-start: {name!r} is {tensor.dtype} but {prev!r} in {self.path} is "
                        f"{value.dtype}, whose values it would round (TF refuses a warm start "
                        "into another dtype): build the module in the checkpoint's dtype, and "
                        "use torch.autocast for lower-precision compute")
                tensor.copy_(value)
                self._started += 1
                if info is None:
                    logger.info("Warm-started %s from %s", name, prev)
