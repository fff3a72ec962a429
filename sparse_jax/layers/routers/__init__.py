"""MoE routers: one module per variant, each returning a `Routing`."""

from sparse_jax.layers.routers.noisy_topk import NoisyTopKRouter
from sparse_jax.layers.routers.routing import Router, Routing, entropy_regularizer
from sparse_jax.layers.routers.sbase import SBaseRouter
from sparse_jax.layers.routers.sigma import SigmaRouter
from sparse_jax.layers.routers.softmax import SoftmaxRouter
from sparse_jax.layers.routers.switch import SwitchRouter

__all__ = ["NoisyTopKRouter", "Router", "Routing", "SBaseRouter", "SigmaRouter",
           "SoftmaxRouter", "SwitchRouter", "entropy_regularizer"]
