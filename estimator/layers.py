"""TF1 layers whose torch counterpart computes otherwise (TF: `tf.compat.v1.layers`)."""
from __future__ import annotations

import torch


class BatchNormalization(torch.nn.Module):
    """TF1's `tf.compat.v1.layers.BatchNormalization` (`batch_normalization`)
    over the last axis of [batch, ..., units], as TF computes it there (its
    non-fused layer, its default for inputs not of 4 dimensions): in
    training the batch mean and the biased batch variance, which also move
    the moving statistics by `1 - momentum` towards them; the moving ones
    otherwise (the scope's eval mode). torch's `BatchNorm1d` moves its
    running variance towards the unbiased batch variance (n / (n - 1) of
    TF's: 1% high at batches of 100), and takes `1 - momentum`.

    Variables as TF names them: `gamma`, `beta`, `moving_mean`,
    `moving_variance`. A convolution's [batch, channels, h, w] is TF's fused
    layer (its default on 4 dimensions), which is torch's:
    `torch.nn.BatchNorm2d(channels, momentum=1 - momentum, eps=epsilon)`.
    """

    def __init__(self, units: int, momentum: float = 0.99, epsilon: float = 1e-3,
                 center: bool = True, scale: bool = True):
        super().__init__()
        if isinstance(units, bool) or not isinstance(units, int) or units < 1:
            raise ValueError(f"BatchNormalization: units must be a positive int (the size of "
                             f"the last axis), got {units!r}")
        self.gamma = torch.nn.Parameter(torch.ones(units)) if scale else None
        self.beta = torch.nn.Parameter(torch.zeros(units)) if center else None
        self.register_buffer("moving_mean", torch.zeros(units))
        self.register_buffer("moving_variance", torch.ones(units))
        self.momentum, self.epsilon = momentum, epsilon

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.moving_mean.shape[0]:
            raise ValueError(f"BatchNormalization({self.moving_mean.shape[0]}): the input's "
                             f"last axis is {x.shape[-1]} (shape {list(x.shape)})")
        if self.training:
            var, mean = torch.var_mean(x, tuple(range(x.dim() - 1)), correction=0)
            with torch.no_grad():
                self.moving_mean.lerp_(mean, 1 - self.momentum)
                self.moving_variance.lerp_(var, 1 - self.momentum)
        else:
            mean, var = self.moving_mean, self.moving_variance
        out = (x - mean) * torch.rsqrt(var + self.epsilon)
        if self.gamma is not None:
            out = out * self.gamma
        return out if self.beta is None else out + self.beta

    def extra_repr(self) -> str:
        return (f"{self.moving_mean.shape[0]}, momentum={self.momentum}, "
                f"epsilon={self.epsilon}")
