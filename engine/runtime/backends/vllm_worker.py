"""Worker-side half of the vLLM backend: builds member weights where the model lives.

vLLM loads this class into its worker (`worker_extension_cls`), so these methods run next
to the model and are reached through `LLM.collective_rpc` with a key, a sign·σ scale and
the fp32 master (by reference: the engine runs in-process); the perturbed weights are built
here by the kind's `member_tensor_` (noise on the tensors it trains), never by subtracting
noise. Low-rank members become LoRA adapters made here from their keys (`vllm_lora`), on
top of the master loaded once. A LoRA run's master adapter is handed over once per
`load_master` and kept here (a copy: the evaluator updates its master in place); its
members' adapters are then made here from their keys and signs·σ alone, on top of the
frozen base the engine loaded.

Why `reload_weights` and not an in-place write: on CPU vLLM repacks every linear weight
into a kernel layout at load time (oneDNN / sgl handles) and empties the parameter, so
editing `parameters()` silently changes nothing. `reload_weights` takes checkpoint-named
tensors, fuses them (q/k/v, gate/up) and repacks. The tied `lm_head` shares the embedding
parameter, which the reload refreshes, but its own packed GEMM handle is not rebuilt, so
it is re-dispatched here.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch

from seedledger.engine.runtime.backends.vllm_lora import register
from seedledger.replay.kinds import PerturbationKind
from seedledger.replay.kinds.base import Shape

Master = Mapping[str, torch.Tensor]


def _perturbed(kind: PerturbationKind, master: Master, key: int, scale: float) -> Iterator[tuple[str, torch.Tensor]]:
    """`(name, member tensor)` one tensor at a time (peak memory: one tensor): the kind's
    `member_tensor_`, cast(master + scale*E) on the tensors it trains."""
    for name, src in master.items():
        yield name, src if scale == 0.0 else kind.member_tensor_(torch.empty_like(src), name, master, key, scale)


class SeedLedgerWorkerExtension:
    """Mixed into vLLM's worker class; `self` is the worker (it has `model_runner`)."""

    def seedledger_load(self, kind: PerturbationKind, key: int, scale: float, master: Master) -> None:
        """Load `kind`'s member `cast(master + scale*E(key))` (scale 0: the master itself).

        `master` arrives by reference when the engine is in-process (the backend's mode).
        """
        with torch.no_grad():
            self.reload_weights(weights_iterator=_perturbed(kind, master, key, scale))  # type: ignore[attr-defined]
            self._seedledger_redispatch_tied()

    def seedledger_members(self, kind: PerturbationKind, ids: list[int], keys: list[int | None],
                           scales: list[float], linears: dict[str, Shape]) -> None:
        """Replace the engine's LoRA adapters by one per member, as `kind` makes them
        (`PerturbationKind.lora_members`: a low-rank member's factors on `linears`; an
        adapter run's cast(master + scale·ε(key)), key None: the master adapter itself,
        from the master kept by `seedledger_keep_master`)."""
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        master = getattr(self, "_seedledger_master", None)
        register(model, zip(ids, kind.lora_members(master, linears, keys, scales), strict=True), kind.lora_rank)

    def seedledger_keep_master(self, master: Master) -> None:
        """Keep a frozen-base run's fp32 master adapter (a copy) for the adapters made from it."""
        self._seedledger_master = {n: t.detach().clone() for n, t in master.items()}

    def _seedledger_redispatch_tied(self) -> None:
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        lm_head = getattr(model, "lm_head", None)
        if lm_head is None or not hasattr(lm_head, "cpu_linear"):
            return  # not CPU, or no separate output layer: nothing cached
        from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

        dispatch_cpu_unquantized_gemm(lm_head, remove_weight=False)

    def seedledger_probe(self, name: str) -> list[float]:
        """First values of a model parameter (tests: did a reload reach the model?)."""
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        param = dict(model.named_parameters())[name]
        return param.detach().reshape(-1)[:4].float().tolist()
