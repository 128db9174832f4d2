"""Reference files for tests/lua/test_t5.lua (ck.t5), written to tests/data/t5/.

Builds a small random-weight transformers T5EncoderModel (T5 v1.1's encoder: RMS layer
norms, unscaled attention with layer 0's relative position bias shared by every layer,
gated-GELU feed-forward) from a config, with no hub access:
  vocab 512, d_model 32, 4 heads of d_kv 6 (inner width 24, not d_model: the two are apart
  in T5's configs), d_ff 48, 3 layers, 16 buckets, max distance 20 (so 40 tokens reach the
  saturated buckets), eps 1e-6, feed_forward_proj "gated-gelu" (gelu_new, the tanh form).
Every weight is drawn at a trained-looking scale (transformers' own init leaves layer norms at
1), the relative attention bias at std 1.5, so that the position bias moves the attention
visibly; the model runs with attn_implementation="eager" (the plain matmul/softmax path;
sdpa is checked to agree).

Writes:
  text_encoder_2/            the model as save_pretrained writes it for a Flux folder's
                             text_encoder_2/: config.json, fp32 shards of at most 40 KB and
                             model.safetensors.index.json (transformers 5 saves shared.weight, not
                             its tied encoder.embed_tokens.weight); from_pretrained loads it back whole
  t5_fp16.safetensors        the same weights as one file in fp16, with both shared.weight and
                             encoder.embed_tokens.weight (as files converted by older tools hold them)
  t5_bf16.safetensors        one file in bf16, encoder.embed_tokens.weight alone (no shared.weight)
  t5_fp8_e4m3fn.safetensors  one file with every tensor float8_e4m3fn (ComfyUI's t5xxl_fp8_e4m3fn
                             layout: the same keys, each weight cast)
  outputs.safetensors        ids and reference outputs (fp32):
    ids [3,40]               three rows: 40 tokens; 25 tokens, EOS (1), pad (0); 5 tokens, EOS, pad
    mask [3,40]              their attention mask (1 for tokens and EOS, 0 for pad)
    last_hidden_state [3,40,32]          T5EncoderModel(ids): no mask, pads attended (BFL's use)
    last_hidden_state_masked [3,40,32]   T5EncoderModel(ids, attention_mask=mask) (kohya's
                                         --apply_t5_attn_mask)
    last_hidden_state_fp16, _bf16, _fp8 [3,40,32]   no mask, the fp32 model holding the weights of
                                         that file (each value rounded to the dtype, computed in fp32)
    last_hidden_state_hf_bf16 [3,40,32]  T5EncoderModel in bf16 (dtype=torch.bfloat16), no mask: the
                                         error bf16 itself brings to these weights
    ids_short [2,7], last_hidden_state_short [2,7,32]   7 tokens (a shorter bias table)
    buckets_32_128 [2201], buckets_16_20 [2201]   T5Attention._relative_position_bucket
                             (bidirectional) of relative positions -1100..1100 for t5-v1_1-xxl's 32
                             buckets / distance 128 and the reference's 16 / 20
  t5_xxl_keys.txt            every key of google/t5-v1_1-xxl's T5EncoderModel with its shape (its
                             config, built on the meta device)
  VERSIONS.txt               the package versions that made these files

Run: python tests/ref/make_t5_ref.py  (from the repository root, with torch, transformers and
safetensors importable; VERSIONS.txt names the versions that made the files here)
"""
import os
import sys

import torch
import safetensors.torch
import transformers
from transformers import T5Config, T5EncoderModel
from transformers.models.t5.modeling_t5 import T5Attention

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "t5")
L = 40
PAD, EOS = 0, 1


def ref_config():
    return T5Config(vocab_size=512, d_model=32, d_kv=6, d_ff=48, num_layers=3, num_heads=4,
                    relative_attention_num_buckets=16, relative_attention_max_distance=20,
                    layer_norm_epsilon=1e-6, feed_forward_proj="gated-gelu", dropout_rate=0.0,
                    is_encoder_decoder=False, use_cache=False, tie_word_embeddings=False)


def xxl_config():
    # google/t5-v1_1-xxl's config.json (kohya's flux_utils T5_CONFIG_JSON)
    return T5Config(vocab_size=32128, d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_heads=64,
                    relative_attention_num_buckets=32, relative_attention_max_distance=128,
                    layer_norm_epsilon=1e-6, feed_forward_proj="gated-gelu", tie_word_embeddings=False)


def randomize(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layer_norm" in name:
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
            elif "relative_attention_bias" in name:
                p.copy_(1.5 * torch.randn(p.shape, generator=g))
            elif name == "shared.weight":
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.25 * torch.randn(p.shape, generator=g))


def id_rows():
    g = torch.Generator().manual_seed(5)
    rows, masks = [], []
    for n in (L, 25, 5):
        if n == L:
            row = torch.randint(2, 512, (L,), generator=g).tolist()
        else:
            row = torch.randint(2, 512, (n,), generator=g).tolist() + [EOS]
            row += [PAD] * (L - len(row))
        rows.append(row)
        masks.append([0 if (i >= n + 1 and n < L) else 1 for i in range(L)])
    return torch.tensor(rows, dtype=torch.long), torch.tensor(masks, dtype=torch.long)


def rounded(model, dtype):
    """The fp32 model holding its weights rounded to dtype (what a file of that dtype loads into fp32)."""
    m = T5EncoderModel(model.config).eval()
    m.load_state_dict({k: v.to(dtype).float() for k, v in model.state_dict().items()})
    return m


def keys_file(path, model):
    with open(path, "w") as f:
        for k, v in model.state_dict().items():
            if k == "encoder.embed_tokens.weight":
                continue  # tied to shared.weight; save_pretrained leaves it out
            f.write("%s [%s]\n" % (k, ",".join(str(d) for d in v.shape)))


def main():
    os.makedirs(OUT, exist_ok=True)
    torch.manual_seed(0)
    model = T5EncoderModel(ref_config()).eval()
    model.set_attn_implementation("eager")
    assert model.config._attn_implementation == "eager"
    randomize(model, 1)
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    assert torch.equal(sd["shared.weight"], sd["encoder.embed_tokens.weight"])

    d = os.path.join(OUT, "text_encoder_2")
    os.makedirs(d, exist_ok=True)
    model.save_pretrained(d, max_shard_size="40KB")
    assert os.path.exists(os.path.join(d, "model.safetensors.index.json")), os.listdir(d)
    back = T5EncoderModel.from_pretrained(d, attn_implementation="eager")
    for k, v in sd.items():
        assert torch.equal(back.state_dict()[k], v), k

    one = {k: v for k, v in sd.items()}
    safetensors.torch.save_file({k: v.half() for k, v in one.items()}, os.path.join(OUT, "t5_fp16.safetensors"),
                                metadata={"format": "pt"})
    safetensors.torch.save_file({k: v.bfloat16() for k, v in one.items() if k != "shared.weight"},
                                os.path.join(OUT, "t5_bf16.safetensors"), metadata={"format": "pt"})
    no_tied = {k: v for k, v in one.items() if k != "encoder.embed_tokens.weight"}
    assert max(v.abs().max().item() for v in no_tied.values()) < 448  # e4m3fn's largest finite value
    safetensors.torch.save_file({k: v.to(torch.float8_e4m3fn) for k, v in no_tied.items()},
                                os.path.join(OUT, "t5_fp8_e4m3fn.safetensors"))

    ids, mask = id_rows()
    out = {"ids": ids.float(), "mask": mask.float()}
    with torch.no_grad():
        out["last_hidden_state"] = model(ids).last_hidden_state
        out["last_hidden_state_masked"] = model(ids, attention_mask=mask).last_hidden_state
        # the mask matters, visibly, at the real tokens of the padded rows, and so does the bias
        assert (out["last_hidden_state"][1:, :5] - out["last_hidden_state_masked"][1:, :5]).abs().max() > 0.05
        assert torch.equal(out["last_hidden_state"][0], out["last_hidden_state_masked"][0])
        flat = rounded(model, torch.float32)
        flat.encoder.block[0].layer[0].SelfAttention.relative_attention_bias.weight.zero_()
        assert (flat(ids).last_hidden_state - out["last_hidden_state"]).abs().max() > 0.05
        sdpa = T5EncoderModel.from_pretrained(d, attn_implementation="sdpa").eval()
        assert torch.allclose(sdpa(ids, attention_mask=mask).last_hidden_state, out["last_hidden_state_masked"],
                              atol=1e-5)
        for name, dt in (("fp16", torch.float16), ("bf16", torch.bfloat16), ("fp8", torch.float8_e4m3fn)):
            out["last_hidden_state_" + name] = rounded(model, dt)(ids).last_hidden_state
        # transformers' own bf16 run (weights and activations bf16): how far bf16 is from fp32 here
        hb = T5EncoderModel.from_pretrained(d, attn_implementation="eager", dtype=torch.bfloat16).eval()
        out["last_hidden_state_hf_bf16"] = hb(ids).last_hidden_state.float()
        short = ids[:2, :7].clone()
        short[:, 6] = EOS
        out["ids_short"] = short.float()
        out["last_hidden_state_short"] = model(short).last_hidden_state
        rel = torch.arange(-1100, 1101)
        out["buckets_32_128"] = T5Attention._relative_position_bucket(rel, True, 32, 128).float()
        out["buckets_16_20"] = T5Attention._relative_position_bucket(rel, True, 16, 20).float()
        # the bias table is used past max_distance: saturated buckets (15 and 7) at 40 tokens
        assert out["buckets_16_20"][1100 + 39] == 15 and out["buckets_16_20"][1100 - 39] == 7
    safetensors.torch.save_file({k: v.float().contiguous() for k, v in out.items()},
                                os.path.join(OUT, "outputs.safetensors"))

    with torch.device("meta"):
        keys_file(os.path.join(OUT, "t5_xxl_keys.txt"), T5EncoderModel(xxl_config()))

    with open(os.path.join(OUT, "VERSIONS.txt"), "w") as f:
        f.write("made by tests/ref/make_t5_ref.py with\n")
        f.write("python %s\n" % sys.version.split()[0])
        for mod in (torch, transformers, safetensors):
            f.write("%s %s\n" % (mod.__name__.split(".")[0], getattr(mod, "__version__", "?")))


if __name__ == "__main__":
    main()
