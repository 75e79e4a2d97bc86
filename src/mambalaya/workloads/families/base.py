"""What the dense hybrid families (Nemotron-H, OLMo-Hybrid as a whole model, ...) share: a
model config whose layers come in several types, each type one cascade, and one way to build,
feed and run a layer of any of them.

A family's config (a :class:`FamilyModel`) lists its layers (``layer_types``, mambalaya's names
for them), counts its weights from the module shapes, and builds one layer of a type as one
cascade (:meth:`FamilyModel.layer`). The evaluation (``mambalaya evaluate``, ``compare``,
``sweep``, ``reproduce --suite hybrid``) treats it as it treats a Bamba model: every layer type
evaluated on the design, the whole model the sum over layers (:func:`is_hybrid`,
:func:`scanned_layer_types`).

:func:`family_inputs` gives a layer cascade every input besides ``X`` and the weights (the
causal masks and rotary tables of attention, the chunked scans' constants, the incoming state)
and :func:`~mambalaya.execute.layers.run_family_layer` runs one step of one layer, as
:func:`~mambalaya.execute.layers.run_hybrid_layer` does for Bamba.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar

import numpy as np
from pydantic import BaseModel, BeforeValidator, PositiveInt

from mambalaya.einsum.cascade import Cascade
from mambalaya.errors import SpecError
from mambalaya.specio import SPEC_MODEL_CONFIG, list_as_tuple
from mambalaya.workloads.blocks.attention import KEY_BLOCK
from mambalaya.workloads.blocks.masks import causal_mask, key_block_mask

#: The prefix of the second block's tensors in a layer made of two blocks (as Bamba's ``FF_``).
SECOND_PREFIX = "FF_"


class FamilyModel(BaseModel):
    """A model of one dense hybrid family: ``layer_types`` (mambalaya's names, in layer order),
    the hidden size and the vocabulary. Subclasses name their layer types (``LAYER_TYPES``),
    the ones whose prefill has both scan forms (``SCANNED``), count a layer's weights and build
    a layer's cascade. A field with a default takes the transformers class's default; the others
    are required. Strict (:data:`~mambalaya.specio.SPEC_MODEL_CONFIG`): integers are integers,
    booleans booleans, numbers finite; ``layer_types`` may be given as a list."""

    model_config = SPEC_MODEL_CONFIG

    LAYER_TYPES: ClassVar[tuple[str, ...]] = ()
    SCANNED: ClassVar[tuple[str, ...]] = ()

    d_model: PositiveInt
    layer_types: Annotated[tuple[str, ...], BeforeValidator(list_as_tuple)]
    vocab_size: PositiveInt
    tie_embeddings: bool = False

    @property
    def n_layers(self) -> int:
        return len(self.layer_types)

    def layer_counts(self) -> dict[str, int]:
        counts = Counter(self.layer_types)
        return {t: counts[t] for t in self.LAYER_TYPES if counts[t]}

    def layer_parameters(self, layer_type: str) -> int:  # pragma: no cover - every family defines it
        raise NotImplementedError

    def extra_parameters(self) -> int:
        """Weights outside the layers besides the embedding, LM head and final norm (none here)."""
        return 0

    def shared_parameters(self, layer_types: set[str]) -> int:
        """Of :meth:`extra_parameters`, the weights a device running layers of ``layer_types``
        must hold besides those layers' own (weights several layers share; none here)."""
        return 0

    def model_parameters(self) -> int:
        """Embedding (and the LM head unless tied) + every layer + the final norm."""
        embed = self.vocab_size * self.d_model * (1 if self.tie_embeddings else 2)
        layers = sum(n * self.layer_parameters(t) for t, n in self.layer_counts().items())
        return embed + layers + self.extra_parameters() + self.d_model

    def layer(self, layer_type: str, *, batch: int, seq_len: int, phase: str = "prefill", bits: int = 16,
              scan: str | None = None, softmax: str = "three-pass", name: str | None = None,
              key_block: int = KEY_BLOCK) -> Cascade:
        """One layer of ``layer_type`` as one cascade (``seq_len``: the prompt in prefill, the
        cached positions before the new one in decode); ``softmax`` and ``key_block``: its
        attention's form (:func:`~mambalaya.workloads.blocks.attention.attention_layer`)."""
        raise NotImplementedError  # pragma: no cover - every family defines it

    def precision_family(self, layer_type: str) -> str:
        """The precision policy's family whose entries set this layer's tensor widths."""
        return "bamba"

    def attention_config(self) -> Any:
        """The :class:`~mambalaya.workloads.blocks.attention.AttentionConfig` of the attention layers
        (its rotary tables), or None."""
        return None

    def constants(self, cascade: Cascade) -> dict[str, np.ndarray]:
        """Constant inputs of a layer cascade only this family has: the causal mask ``AMK`` of a
        layer that runs attention inside one cascade (Falcon-H1's parallel block, Zamba2's
        shared block), or its blocked softmax's key mask ``AKM`` (a decode step's query is at
        the cache length ``M``)."""
        out = {"AMK": causal_mask(*cascade.shape("AMK"))} if "AMK" in cascade.tensors else {}
        if "AKM" in cascade.tensors:
            first = cascade.size("M") if "M" in cascade.ranks else 0
            out["AKM"] = key_block_mask(*cascade.shape("AKM"), first=first)
        return out

    def shape_text(self) -> str:
        counts = ", ".join(f"{n} {t}" for t, n in self.layer_counts().items())
        return f"layers: {counts}"

    def check_layer_type(self, layer_type: str | None) -> str:
        if layer_type is None or layer_type not in self.layer_counts():
            what = "name the one to build" if layer_type is None else f"it has no {layer_type!r} layer; name one of them"
            raise SpecError(f"a {self.family} model has layers of types {', '.join(self.layer_counts())}; {what} "  # type: ignore[attr-defined]
                            "(layer_type, --layer-type)")
        return layer_type


def is_hybrid(config: Any) -> bool:
    """Whether ``config`` is a model of several layer types evaluated layer type by layer type
    (Bamba, a mixture-of-experts hybrid family, or a dense hybrid family)."""
    return getattr(config, "family", None) in ("bamba", "jamba", "granitemoehybrid") or isinstance(config, FamilyModel)


def scanned_layer_types(config: Any) -> tuple[str, ...]:
    """The layer types of a hybrid model whose prefill has a chunked and a recurrent form."""
    if isinstance(config, FamilyModel):
        return config.SCANNED
    if getattr(config, "family", None) in ("jamba", "granitemoehybrid"):  # "mamba" and "mamba-moe"
        return tuple(t for t in config.layer_counts() if t.split("-")[0] == "mamba")
    return ("mamba",)


def build_family_layer(model: FamilyModel, *, phase: str, seq_len: int, batch: int, bits: int = 16,
                       state_io: bool | None = None, name: str | None = None, scan: str | None = None,
                       layer_type: str | None = None, softmax: str = "three-pass",
                       key_block: int = KEY_BLOCK) -> Cascade:
    """:func:`~mambalaya.workloads.layers.layer_cascade` for a dense hybrid family's model."""
    layer_type = model.check_layer_type(layer_type)
    if state_io is False:
        raise SpecError(f"a {model.family} model's layers always carry their state and KV cache out; "  # type: ignore[attr-defined]
                        "state_io cannot be False")
    if scan is not None and layer_type not in model.SCANNED:
        raise SpecError(f"scan applies to the layers with a scan ({', '.join(model.SCANNED) or 'none'}); a "
                        f"{layer_type} layer has none")
    return model.layer(layer_type, batch=batch, seq_len=seq_len, phase=phase, bits=bits, scan=scan,
                       softmax=softmax, name=name, key_block=key_block)


def family_inputs(cascade: Cascade, model: FamilyModel, *, state: Mapping[str, Any] | None = None
                  ) -> dict[str, np.ndarray]:
    """Every input of a family layer's cascade besides ``X`` and the weights: the constants
    (causal masks and rotary tables of attention, the chunked scans' masks) and the incoming
    state: ``state`` (exactly the cascade's incoming state tensors, each of its shape), or zeros
    for a prefill from a fresh cache."""
    from mambalaya.workloads.blocks.attention import attention_constants
    from mambalaya.workloads.blocks.gated_deltanet import gdn_constants
    from mambalaya.workloads.families.bamba import incoming_state
    from mambalaya.workloads.blocks.mamba2 import mamba2_constants

    out: dict[str, np.ndarray] = {}
    if "T" in cascade.ranks and "CM" in cascade.tensors and cascade.tensors["CM"].ranks == ("I", "T") \
            or "KM" in cascade.tensors or "COS" in cascade.tensors:
        out.update(attention_constants(cascade, model.attention_config()))
    out.update(gdn_constants(cascade) if "EYE" in cascade.tensors else mamba2_constants(cascade))
    out.update(model.constants(cascade))
    decode = ", decode," in cascade.description.split(";")[0] + ","  # the first block's builder names its phase
    return {**out, **incoming_state(cascade, state, decode=decode)}


__all__ = ["SECOND_PREFIX", "FamilyModel", "build_family_layer", "family_inputs", "is_hybrid",
           "scanned_layer_types"]
