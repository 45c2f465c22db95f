"""TF1 layers whose torch counterpart computes otherwise (TF: `tf.compat.v1.layers`)."""
from __future__ import annotations

import torch


class BatchNormalization(torch.nn.Module):
    """TF1's `tf.compat.v1.layers.BatchNormalization` (`batch_normalization`)
    over the last axis of [batch, ..., units], as TF computes it: in training
    the batch mean and variance, which also move the moving statistics by
    `1 - momentum` towards them; the moving ones otherwise (the scope's eval
    mode). The moving variance moves towards the biased batch variance on
    inputs of 2 or 3 dimensions (TF's non-fused layer), towards the unbiased
    one on 4 or 5 (TF's fused layer, its default there: NHWC); `fused`
    chooses as TF's. torch's `BatchNorm1d` always takes the unbiased one
    (n / (n - 1) of TF's on [batch, units]: 1% high at batches of 100), and
    `1 - momentum`.

    Variables as TF names them: `gamma`, `beta`, `moving_mean`,
    `moving_variance` (float32, as TF's for float32 inputs). A torch
    convolution's [batch, channels, h, w] (NCHW) takes torch's layer, which
    is TF's fused one: `torch.nn.BatchNorm2d(channels, momentum=1 - momentum,
    eps=epsilon)`.
    """
    # its training forward pass moves its buffers: a moving average of them
    # begun after it starts from their initial values (as torch's batch norm)
    updates_buffers_in_forward = True

    def __init__(self, units: int, momentum: float = 0.99, epsilon: float = 1e-3,
                 center: bool = True, scale: bool = True, fused=None):
        super().__init__()
        if isinstance(units, bool) or not isinstance(units, int) or units < 1:
            raise ValueError(f"BatchNormalization: units must be a positive int (the size of "
                             f"the last axis), got {units!r}")
        self.gamma = torch.nn.Parameter(torch.ones(units)) if scale else None
        self.beta = torch.nn.Parameter(torch.zeros(units)) if center else None
        self.register_buffer("moving_mean", torch.zeros(units))
        self.register_buffer("moving_variance", torch.ones(units))
        self.momentum, self.epsilon, self.fused = momentum, epsilon, fused

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.moving_mean.shape[0]:
            raise ValueError(f"BatchNormalization({self.moving_mean.shape[0]}): the input's "
                             f"last axis is {x.shape[-1]} (shape {list(x.shape)})")
        if self.training:
            dims = tuple(range(x.dim() - 1))
            var, mean = torch.var_mean(x, dims, correction=0)
            fused = x.dim() in (4, 5) if self.fused is None else self.fused
            moving_var = var
            if fused:   # (TF's fused kernel moves the average towards the unbiased one)
                count = x.numel() // x.shape[-1]
                moving_var = var * (count / max(count - 1, 1))
            with torch.no_grad():
                self.moving_mean.lerp_(mean.to(self.moving_mean.dtype), 1 - self.momentum)
                self.moving_variance.lerp_(moving_var.to(self.moving_variance.dtype),
                                           1 - self.momentum)
        else:
            mean, var = self.moving_mean, self.moving_variance
        out = (x - mean) * torch.rsqrt(var + self.epsilon)
        if self.gamma is not None:
            out = out * self.gamma
        return out if self.beta is None else out + self.beta

    def extra_repr(self) -> str:
        return (f"{self.moving_mean.shape[0]}, momentum={self.momentum}, "
                f"epsilon={self.epsilon}")
