"""OLMo-Hybrid as a whole model (transformers' ``OlmoHybridConfig``): Gated DeltaNet layers and
attention layers, each with its MLP, one cascade per layer type.

* ``gdn`` (``linear_attention``, ``OlmoHybridLinearAttentionDecoderLayer``): pre-norm, as Bamba:
  ``h = x + linear_attn(input_layernorm(x))`` (the Gated DeltaNet block of
  :mod:`~mambalaya.workloads.blocks.gated_deltanet`), then ``h + mlp(post_attention_layernorm(h))``
  (the gated SiLU MLP block of :mod:`~mambalaya.workloads.blocks.mlp`, whose pre-norm is the layer's
  ``post_attention_layernorm``).
* ``attention`` (``full_attention``, ``OlmoHybridAttentionDecoderLayer``): **post-norm**, with
  no input norm: ``h = x + post_attention_layernorm(self_attn(x))`` then
  ``h + post_feedforward_layernorm(mlp(h))``. The attention (:func:`olmo_attention_block`) has a
  **QK-norm over the whole projection** (``q_norm`` an RMSNorm over all ``n_heads*head_dim``
  query channels, ``k_norm`` over all ``n_kv_heads*head_dim`` key channels, before the heads are
  split), then the rotary embedding over whole heads, or none when ``rope_parameters.rope_theta``
  is null (NoPE, which transformers' modeling code says the released checkpoints use). The
  MLP block is :func:`post_norm_mlp_block`.

Ranks of the attention block: ``B``, ``I``, ``T``, ``D``, ``G`` KV heads, ``R`` query heads per
KV head, ``P`` query/key channels of a head, ``E`` value channels (``P = E = head_dim``), ``M``
cached positions in decode. Einsums:

* ``QI = X x WQ``, ``QS = sum QI^2``, ``QRS = rsqrt(QS/qdim + eps)``, ``QB = QI*QRS*WQN``
  (and ``KI``, ``KS``, ``KRS``, ``KB`` for the key with ``kdim``), ``V = X x WV``
* with the rotary embedding, the query and key channels are laid out ``[U, W]`` (halves x
  frequencies) and ``QR``, ``KR`` rotate ``QB``, ``KB`` as :mod:`~mambalaya.workloads.blocks.attention`
  does; without, they are ``P``
* ``SC = QR*KR*scale + CM`` (``QB*KB`` without rotation), the softmax (three-pass, online or blocked, as
  :mod:`~mambalaya.workloads.blocks.attention`), ``AO = PR x V``, ``O = AO x WO``
* ``PSS = sum O^2``, ``PRS = rsqrt(PSS/D + eps)``, ``PON = O*PRS*WPN``, ``XO = X + PON``

The KV cache holds the normalised (and rotated) keys, ``KC0A`` (``KC0B`` without rotation), and
the values ``VC0``, as transformers' ``cache.update`` receives them; a step appends ``KNA``
(``KNB``) and ``VN``.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import BeforeValidator, Field, model_validator

from mambalaya.einsum.cascade import Cascade, build_cascade
from mambalaya.einsum.compose import chain_cascades
from mambalaya.einsum.ir import Rank, Role, TensorSpec
from mambalaya.einsum.parse import parse_einsum
from mambalaya.errors import SpecError
from mambalaya.specio import list_as_tuple
from mambalaya.workloads.blocks.attention import (ATTENTION_REGION, KEY_BLOCK, ONLINE, THREE_PASS, AttentionConfig,
                                                   blocked_softmax_lines, blocked_tensors, check_softmax,
                                                   key_block_ranks, kv_cache_tensors)
from mambalaya.workloads.checks import check_layer_args, chunk_padding_free_form
from mambalaya.workloads.families.base import SECOND_PREFIX, FamilyModel
from mambalaya.workloads.blocks.gated_deltanet import LINEAR, GatedDeltaNetConfig, gdn_layer
from mambalaya.workloads.blocks.gated_deltanet import PRESETS as GDN_PRESETS
from mambalaya.workloads.hf.config import check_known_fields, ConfigFile, default_rope_theta
from mambalaya.workloads.blocks.masks import causal_band, key_blocks, with_masks
from mambalaya.workloads.blocks.mlp import MLPConfig, mlp_layer

_W, _X, _IN, _ST = Role.WEIGHT, Role.INTERMEDIATE, Role.INPUT, Role.STATE
_TENSORS: dict[str, tuple[tuple[str, ...], Role, str]] = {
    "X": (("B", "I", "D"), _IN, "layer input (residual stream)"),
    "WQ": (("D", "G", "R", "P"), _W, "q_proj"), "WK": (("D", "G", "P"), _W, "k_proj"),
    "WV": (("D", "G", "E"), _W, "v_proj"),
    "QI": (("B", "I", "G", "R", "P"), _X, "query projection"), "KI": (("B", "I", "G", "P"), _X, "key projection"),
    "QS": (("B", "I"), _X, "q_norm sum of squares"), "KS": (("B", "I"), _X, "k_norm sum of squares"),
    "QRS": (("B", "I"), _X, "q_norm reciprocal RMS"), "KRS": (("B", "I"), _X, "k_norm reciprocal RMS"),
    "WQN": (("G", "R", "P"), _W, "q_norm weight"), "WKN": (("G", "P"), _W, "k_norm weight"),
    "QB": (("B", "I", "G", "R", "P"), _X, "normalised query"), "KB": (("B", "I", "G", "P"), _X, "normalised key"),
    "V": (("B", "I", "G", "E"), _X, "value"),
    "CM": (("I", "T"), _IN, "causal mask in log space: 0 if t <= i else -inf"),
    "SC": (("B", "I", "T", "G", "R"), _X, "scaled, masked scores"),
    "MX": (("B", "I", "G", "R"), _X, "row max of the scores"), "EX": (("B", "I", "T", "G", "R"), _X, "exp(score - max)"),
    "SM": (("B", "I", "G", "R"), _X, "row sum"), "PR": (("B", "I", "T", "G", "R"), _X, "attention probabilities"),
    "MR": (("B", "I", "T", "G", "R"), _X, "running max (online softmax)"),
    "CF": (("B", "I", "T", "G", "R"), _X, "rescale factor"), "PE": (("B", "I", "T", "G", "R"), _X, "exp(score - running max)"),
    "LR": (("B", "I", "T", "G", "R"), _X, "running sum"), "OR": (("B", "I", "T", "G", "R", "E"), _X, "running weighted values"),
    "AO": (("B", "I", "G", "R", "E"), _X, "attention output per head"),
    "WO": (("G", "R", "E", "D"), _W, "o_proj"), "O": (("B", "I", "D"), _X, "attention output"),
    "PSS": (("B", "I"), _X, "post-norm sum of squares"), "PRS": (("B", "I"), _X, "post-norm reciprocal RMS"),
    "WPN": (("D",), _W, "post_attention_layernorm weight"), "PON": (("B", "I", "D"), _X, "post-normed attention output"),
    "XO": (("B", "I", "D"), Role.OUTPUT, "block output (residual stream)"),
}
#: The attention block's weights (what the loader returns).
ATTENTION_WEIGHTS = ("WQ", "WK", "WV", "WQN", "WKN", "WO", "WPN")


def olmo_attention_block(config: GatedDeltaNetConfig, *, batch: int, seq_len: int, phase: str = "prefill",
                         bits: int = 16, softmax: str = "three-pass", rope_theta: float | None = None,
                         name: str | None = None, key_block: int = KEY_BLOCK) -> Cascade:
    """OLMo-Hybrid's attention with QK-norm and its post-norm residual (see the module
    docstring), rotary over whole heads when ``rope_theta`` is given, none (NoPE) when it is
    None; prefill of ``seq_len`` positions or one decode step after ``seq_len`` cached ones.
    ``softmax="blocked"`` runs over blocks of ``key_block`` keys, as the attention block's."""
    check_softmax(softmax)
    check_layer_args(phase, batch=batch, seq_len=seq_len, bits=bits)
    c, decode, rope = config, phase == "decode", rope_theta is not None
    hd = c.head_dim or c.d_model // c.n_heads
    if rope and hd % 2:
        raise SpecError(f"head_dim = {hd} is odd: the rotary embedding rotates pairs of channels")
    positions, keys = (1, seq_len + 1) if decode else (seq_len, seq_len)
    ranks = [Rank("B", batch, "batch"), Rank("I", positions, "1" if decode else "L"),
             Rank("T", keys, "L+1" if decode else "L"), Rank("D", c.d_model, "hidden_size"),
             Rank("G", c.n_kv_heads, "n_kv_heads"), Rank("R", c.n_heads // c.n_kv_heads, "n_heads/n_kv_heads"),
             Rank("E", hd, "head_dim")]
    ranks += [Rank("U", 2, "2"), Rank("W", hd // 2, "head_dim/2")] if rope else [Rank("P", hd, "head_dim")]
    if decode:
        ranks.append(Rank("M", seq_len, "L"))
    blocked = softmax == "blocked"
    if blocked:
        ranks = [r for r in ranks if r.name != "T"] + key_block_ranks(keys, key_block, decode=decode)
    t, ch = ("t-(T-1)" if decode else "t"), ("u,w" if rope else "p")
    lines = [
        f"QI[b,i,g,r,{ch}] = X[b,i,d]*WQ[d,g,r,{ch}]",
        f"QS[b,i] = QI[b,i,g,r,{ch}]*QI[b,i,g,r,{ch}]",
        "QRS[b,i] = rsqrt(QS[b,i]/qdim + eps)",
        f"QB[b,i,g,r,{ch}] = QI[b,i,g,r,{ch}]*QRS[b,i]*WQN[g,r,{ch}]",
        f"KI[b,i,g,{ch}] = X[b,i,d]*WK[d,g,{ch}]",
        f"KS[b,i] = KI[b,i,g,{ch}]*KI[b,i,g,{ch}]",
        "KRS[b,i] = rsqrt(KS[b,i]/kdim + eps)",
        f"KB[b,i,g,{ch}] = KI[b,i,g,{ch}]*KRS[b,i]*WKN[g,{ch}]",
        "V[b,i,g,e] = X[b,i,d]*WV[d,g,e]",
    ]
    if rope:
        lines += ["QR[b,i,g,r,u,w] = QB[b,i,g,r,u,w]*COS[i,w] + QB[b,i,g,r,1-u,w]*SIN[u,i,w]",
                  "KR[b,i,g,u,w] = KB[b,i,g,u,w]*COS[i,w] + KB[b,i,g,1-u,w]*SIN[u,i,w]"]
    key, q = ("KR", "QR") if rope else ("KB", "QB")
    if blocked:
        lines += blocked_softmax_lines([f"{q}[b,i,g,r,{ch}]*{key}[b,{{k}},g,{ch}]*scale"], decode=decode)
    else:
        lines += [
            f"SC[b,i,t,g,r] = {q}[b,i,g,r,{ch}]*{key}[b,{t},g,{ch}]*scale" + ("" if decode else " + CM[i,t]"),
            *(line.replace("{t}", t) for line in (ONLINE if softmax == "online" else THREE_PASS)),
        ]
    lines += [
        "O[b,i,d] = AO[b,i,g,r,e]*WO[g,r,e,d]",
        "PSS[b,i] = O[b,i,d]*O[b,i,d]",
        "PRS[b,i] = rsqrt(PSS[b,i]/D + eps)",
        "PON[b,i,d] = O[b,i,d]*PRS[b,i]*WPN[d]",
        "XO[b,i,d] = X[b,i,d] + PON[b,i,d]",
    ]
    cached = (("KR", "KC0A", "KNA") if rope else ("KB", "KC0B", "KNB"), ("V", "VC0", "VN"))
    specs = {**_TENSORS, **blocked_tensors()} if blocked else dict(_TENSORS)
    if rope:
        layout = {"P": ("U", "W")}
        for n in ("WQ", "WK", "QI", "KI", "WQN", "WKN", "QB", "KB"):
            rk, role, d = specs[n]
            specs[n] = (tuple(x for r in rk for x in layout.get(r, (r,))), role, d)
        specs.update({"COS": (("I", "W"), _IN, "rotary cos table at the block's positions"),
                      "SIN": (("U", "I", "W"), _IN, "rotary sin table, signed per half (-sin, +sin)"),
                      "QR": (("B", "I", "G", "R", "U", "W"), _X, "query after rotary embedding"),
                      "KR": (("B", "I", "G", "U", "W"), _X, "key after rotary embedding")})
    for src, _, new in cached:
        idx = ",".join(r.lower() for r in specs[src][0])
        lines.append(f"{new}[{idx}] = {src}[{idx}]")
    sizes = {r.name: r.size for r in ranks}
    einsums = [parse_einsum(line, sizes=sizes) for line in lines]
    used = {e.name for e in einsums} | {x for e in einsums for x in e.input_tensors}
    tensors = {n: TensorSpec(n, rk, role, bits, description=d) for n, (rk, role, d) in specs.items() if n in used}
    tensors = with_masks(tensors, {"CM": causal_band("I", "T"), "KM": key_blocks(first=seq_len if decode else 0)})
    for src, cache, new in cached:
        tensors.update(kv_cache_tensors(tensors[src], cache, new, decode=decode))
    return build_cascade(
        name=name or f"olmo-attention-{phase}",
        params={"batch": batch, "L": seq_len, "hidden_size": c.d_model, "n_heads": c.n_heads,
                "n_kv_heads": c.n_kv_heads, "head_dim": hd, "eps": c.norm_eps, "scale": hd ** -0.5,
                "qdim": c.n_heads * hd, "kdim": c.n_kv_heads * hd, **({"key_block": key_block} if blocked else {})},
        ranks=ranks, tensors=list(tensors.values()), einsums=einsums,
        description=(f"OLMo attention block (QK-norm, {'rotary' if rope else 'no position embedding'}, post-norm), "
                     f"{phase}, {softmax} softmax{f' ({key_block}-key blocks)' if blocked else ''}, hidden {c.d_model}, "
                     f"{c.n_heads} heads ({c.n_kv_heads} kv), head_dim {hd}, batch={batch}, "
                     + (f"1 position after {seq_len} cached" if decode else f"{seq_len} positions")),
        regions={"attention": ATTENTION_REGION[softmax]},
    )


_MLP_LINES = ("GT[b,i,f] = X[b,i,d]*WG[d,f]", "UP[b,i,f] = X[b,i,d]*WU[d,f]",
              "HM[b,i,f] = silu(GT[b,i,f])*UP[b,i,f]", "O[b,i,d] = HM[b,i,f]*WDN[f,d]",
              "SS[b,i] = O[b,i,d]*O[b,i,d]", "RS[b,i] = rsqrt(SS[b,i]/D + eps)",
              "ON[b,i,d] = O[b,i,d]*RS[b,i]*WN[d]", "XO[b,i,d] = X[b,i,d] + ON[b,i,d]")
_MLP_TENSORS = {"X": (("B", "I", "D"), _IN), "WG": (("D", "F"), _W), "WU": (("D", "F"), _W), "GT": (("B", "I", "F"), _X),
                "UP": (("B", "I", "F"), _X), "HM": (("B", "I", "F"), _X), "WDN": (("F", "D"), _W),
                "O": (("B", "I", "D"), _X), "SS": (("B", "I"), _X), "RS": (("B", "I"), _X), "WN": (("D",), _W),
                "ON": (("B", "I", "D"), _X), "XO": (("B", "I", "D"), Role.OUTPUT)}


def post_norm_mlp_block(d_model: int, d_ff: int, *, eps: float, batch: int, seq_len: int, phase: str = "prefill",
                        bits: int = 16) -> Cascade:
    """``x + post_feedforward_layernorm(down(silu(gate(x)) * up(x)))``: OLMo's post-norm MLP block."""
    check_layer_args(phase, batch=batch, seq_len=seq_len, bits=bits)
    positions = 1 if phase == "decode" else seq_len
    ranks = [Rank("B", batch, "batch"), Rank("I", positions, "L"), Rank("D", d_model, "hidden_size"),
             Rank("F", d_ff, "intermediate_size")]
    sizes = {r.name: r.size for r in ranks}
    return build_cascade(
        name=f"post-norm-mlp-{phase}",
        params={"batch": batch, "L": positions, "hidden_size": d_model, "intermediate_size": d_ff, "eps": eps},
        ranks=ranks, tensors=[TensorSpec(n, rk, role, bits) for n, (rk, role) in _MLP_TENSORS.items()],
        einsums=[parse_einsum(line, sizes=sizes) for line in _MLP_LINES],
        description=f"post-norm gated MLP block, {phase}, hidden {d_model}, intermediate {d_ff}, batch={batch}, "
                    f"I={positions}")


class OlmoHybridModel(FamilyModel):
    """OLMo-Hybrid, every layer: ``gdn`` layers (Gated DeltaNet + MLP) and ``attention`` layers
    (post-norm attention + MLP); ``mixer`` holds the shapes (a
    :class:`~mambalaya.workloads.blocks.gated_deltanet.GatedDeltaNetConfig`)."""

    LAYER_TYPES: ClassVar[tuple[str, ...]] = ("gdn", "attention")
    SCANNED: ClassVar[tuple[str, ...]] = ("gdn",)

    family: Literal["olmo_hybrid"] = "olmo_hybrid"
    layer_types: Annotated[tuple[Literal["gdn", "attention"], ...], BeforeValidator(list_as_tuple)]
    mixer: GatedDeltaNetConfig
    #: The attention's rotary base over whole heads; None: no position embedding (NoPE).
    rope_theta: float | None = Field(10000.0, gt=0)

    @classmethod
    def of(cls, mixer: GatedDeltaNetConfig, rope_theta: float | None = 10000.0) -> "OlmoHybridModel":
        return cls(d_model=mixer.d_model, vocab_size=mixer.vocab_size, tie_embeddings=mixer.tie_embeddings,
                   layer_types=tuple("gdn" if t == LINEAR else "attention" for t in mixer.layer_types), mixer=mixer,
                   rope_theta=rope_theta)

    @model_validator(mode="after")
    def _agrees(self) -> "OlmoHybridModel":
        m = self.mixer
        types = tuple("gdn" if t == LINEAR else "attention" for t in m.layer_types)
        if (self.d_model, self.vocab_size, self.tie_embeddings, self.layer_types) != (
                m.d_model, m.vocab_size, m.tie_embeddings, types):
            raise ValueError("d_model, vocab_size, tie_embeddings and layer_types must be the mixer's")
        return self

    @property
    def d_state(self) -> int:
        return self.mixer.d_state

    @property
    def expand(self) -> float:
        return self.mixer.expand

    @property
    def d_conv(self) -> int:
        return self.mixer.d_conv

    def layer_parameters(self, layer_type: str) -> int:
        m = self.mixer
        return (m.layer_parameters() if layer_type == "gdn" else m.attention_parameters()) + m.mlp_parameters()

    def attention_config(self) -> AttentionConfig:
        m = self.mixer
        return AttentionConfig(d_model=m.d_model, n_heads=m.n_heads, n_kv_heads=m.n_kv_heads, head_dim=m.head_dim,
                               rope_theta=self.rope_theta or 10000.0, norm_eps=m.norm_eps,
                               partial_rotary_factor=0.0 if self.rope_theta is None else 1.0)

    def precision_family(self, layer_type: str) -> str:
        return "gated_deltanet" if layer_type == "gdn" else "bamba"

    def shape_text(self) -> str:
        m = self.mixer
        return (f"{super().shape_text()}; gdn k heads={m.num_k_heads} v heads={m.num_v_heads} head dims "
                f"{m.k_head_dim}x{m.v_head_dim}; attention heads={m.n_heads} kv={m.n_kv_heads} (QK-norm, "
                f"{'no rotary' if self.rope_theta is None else f'rotary theta {self.rope_theta:g}'}, post-norm); "
                f"mlp={m.d_ff}")

    def layer(self, layer_type: str, *, batch: int, seq_len: int, phase: str = "prefill", bits: int = 16,
              scan: str | None = None, softmax: str = "three-pass", name: str | None = None,
              key_block: int = KEY_BLOCK) -> Cascade:
        m, name = self.mixer, name or f"olmo_hybrid-{layer_type}-{phase}"
        if layer_type == "attention":
            first = olmo_attention_block(m, batch=batch, seq_len=seq_len, phase=phase, bits=bits, softmax=softmax,
                                         rope_theta=self.rope_theta, key_block=key_block)
            second = post_norm_mlp_block(m.d_model, m.d_ff, eps=m.norm_eps, batch=batch, seq_len=seq_len,
                                         phase=phase, bits=bits)
            return chain_cascades(first, second, prefix=SECOND_PREFIX, name=name)
        if layer_type != "gdn":
            raise SpecError(f"layer type {layer_type!r} is not one of OLMo-Hybrid's ({', '.join(self.LAYER_TYPES)})")
        form = chunk_padding_free_form(scan, phase, seq_len, m.chunk_size, "the layer's MLP would then count the "
                                       "padded rows too (the real model drops them before its MLP)")
        first = gdn_layer(m, batch=batch, seq_len=seq_len, phase=phase, bits=bits, state_io=True, scan=form)
        chunk = first.size("Q") if "Q" in first.ranks else None
        second = mlp_layer(MLPConfig(d_model=m.d_model, d_ff=m.d_ff, norm_eps=m.norm_eps), batch=batch,
                           seq_len=seq_len, phase=phase, bits=bits, chunk_size=chunk)  # type: ignore[arg-type]
        return chain_cascades(first, second, prefix=SECOND_PREFIX, name=name)


#: OlmoHybridConfig's fields the reader reads (through the Gated DeltaNet reader and the rotary embedding).
READ = {"hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
        "vocab_size", "tie_word_embeddings", "rms_norm_eps", "layer_types", "linear_num_key_heads",
        "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim",
        "linear_allow_neg_eigval", "head_dim", "rope_parameters", "rope_theta"}
#: The one value of each field mambalaya models, with why.
MODELLED = {"hidden_act": ("silu", "the conv and MLP activation modelled"),
            "attention_bias": (False, "attention projections without bias")}
#: Fields that cannot change what a layer computes: metadata, tokenizer ids, what forward
#: returns, dropout (off in inference), initialisation ranges (the weights replace them) and
#: the rotary cache length (the rotary tables are computed at the cascade's own positions).
INERT = {"model_type", "architectures", "transformers_version", "torch_dtype", "dtype", "use_cache",
         "pad_token_id", "bos_token_id", "eos_token_id", "max_position_embeddings", "attention_dropout",
         "initializer_range", "linear_a_log_min", "linear_a_log_max", "linear_dt_min", "linear_dt_max",
         "linear_dt_init_floor", "_name_or_path", "id2label", "label2id", "return_dict", "output_hidden_states",
         "output_attentions", "chunk_size_feed_forward", "is_encoder_decoder", "problem_type", "tokenizer_class"}


def olmo_hybrid_config_from_hf(data: dict, *, source: str = "config.json") -> OlmoHybridModel:
    """The whole OLMo-Hybrid model from an ``olmo_hybrid`` config.json, read as
    :func:`~mambalaya.workloads.hf.weights_gdn.gdn_config_from_hf` reads its Gated DeltaNet
    fields, plus what the attention layers need: the rotary embedding as ``OlmoHybridConfig``
    standardises it (``rope_parameters`` absent or null: the default rotary embedding with
    theta 10000; ``rope_theta`` null in it: none, NoPE; only the ``default`` type over whole
    heads is modelled) and no attention bias."""
    from mambalaya.workloads.hf.weights_gdn import gdn_config_from_hf

    mixer = gdn_config_from_hf(data, source=source)
    cfg = ConfigFile.of(data, source, what="OLMo-Hybrid")
    check_known_fields(cfg, "OlmoHybridConfig", READ, INERT, MODELLED)
    theta = default_rope_theta(cfg, nope=True)
    return OlmoHybridModel.of(mixer, theta)


#: OLMo-Hybrid-7B as a whole model: the shapes of the ``olmo-hybrid`` preset (transformers 5.25's
#: OlmoHybridConfig defaults, documented as those of allenai/Olmo-Hybrid-7B: 32 layers, every
#: fourth full attention, hidden 3840, 30 heads, MLP 11008, vocab 100352, untied), with its 8
#: attention layers and all 32 MLPs built too. Its attention rotates whole heads with theta 10000, as
#: transformers builds OlmoHybridConfig() (which standardises a null rope_parameters to that);
#: a config with rope_parameters.rope_theta null is the NoPE form, which transformers' modeling
#: code says the released checkpoints use (the released config.json was not available to check). 7,430,870,688 parameters ("7B"), equal to
#: transformers' OlmoHybridModel + LM head on the meta device (tests/test_dense_families.py).
PRESETS: dict[str, OlmoHybridModel] = {"olmo-hybrid-7b": OlmoHybridModel.of(GDN_PRESETS["olmo-hybrid"])}
PUBLISHED_PARAMETERS_B: dict[str, float] = {"olmo-hybrid-7b": 7.0}

__all__ = ["ATTENTION_WEIGHTS", "INERT", "MODELLED", "PRESETS", "READ", "PUBLISHED_PARAMETERS_B", "OlmoHybridModel", "olmo_attention_block",
           "olmo_hybrid_config_from_hf", "post_norm_mlp_block"]
