"""Reference files for tests/lua/test_clip_text.lua (ck.clip), written to tests/data/clip/.

Builds two small random-weight text encoders from configs (no hub access):
  l: transformers' CLIPTextModel, 3 layers, quick_gelu (the shape of SDXL's text_encoder)
  g: transformers' CLIPTextModelWithProjection, 2 layers, gelu, projection 48 (text_encoder_2)
both with vocab 512, hidden 32, 4 heads, 77 positions, eos_token_id 2 (the legacy
value SDXL's configs carry: the pooled row is the argmax of the ids). Token 510 plays
<|startoftext|>, 511 <|endoftext|> (the two highest ids, as in CLIP's vocabulary).

Writes:
  text_encoder/, text_encoder_2/           l and g as a diffusers folder holds them: config.json and
                                           model.safetensors (fp32) with the keys of SDXL's files
                                           (text_model.*, text_projection.weight), which
                                           from_pretrained loads back whole (checked)
  outputs.safetensors                      ids and reference outputs (fp32):
    ids_l [4,77], ids_g [4,77]             the same four prompts padded with <|endoftext|> (tokenizer)
                                           and with 0 (tokenizer_2), EOS at positions 1, 6, 31, 76
    l.hidden_penultimate, l.last_hidden_state [4,77,32], l.pooler_output [4,32]   (l on ids_l)
    g.hidden_penultimate, g.last_hidden_state [4,77,32], g.text_embeds [4,48]     (g on ids_g)
    ids_first [2,77], g.text_embeds_first [2,48]   g with eos_token_id 300 (the first-EOS rule):
                                           ids where a higher id (505) comes before the first 300
    sdxl.prompt_embeds [4,77,64], sdxl.pooled_prompt_embeds [4,48]
                                           diffusers' StableDiffusionXLPipeline.encode_prompt itself,
                                           run with l and g and tokenizers that return ids_l and ids_g
    sdxl.prompt_embeds_clip_skip_1 [2,77,64]   the same with clip_skip=1, the first two prompts
  sdxl_l_keys.txt, sdxl_g_keys.txt         every key of the full SDXL text encoders with its shape
                                           (CLIP ViT-L/14 and OpenCLIP ViT-bigG/14 configs, built on
                                           the meta device)
  VERSIONS.txt                             the package versions that made these files

Run: /work/venv-ref/bin/python tests/ref/make_clip_ref.py  (from the repository root)
"""
import json
import os
import sys
import types

import torch
import safetensors.torch
import transformers
import diffusers
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection
from diffusers import StableDiffusionXLPipeline

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "clip")
T = 77
BOS, EOS = 510, 511


def tiny_config(layers, act, projection_dim):
    return CLIPTextConfig(vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                          num_attention_heads=4, max_position_embeddings=T, hidden_act=act, layer_norm_eps=1e-5,
                          projection_dim=projection_dim, bos_token_id=0, eos_token_id=2, pad_token_id=1)


def randomize(model, seed):
    """Weights of a trained-looking scale: normal 0.2 (layer norms around 1), so the
    layers change their inputs visibly and the causal mask matters."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layer_norm" in name and name.endswith("weight"):
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.2 * torch.randn(p.shape, generator=g))


def prompts(pad):
    """Four id rows: BOS, tokens, EOS, then pad; EOS at 1, 6, 31 and 76."""
    g = torch.Generator().manual_seed(7)
    rows = []
    for n in (0, 5, 30, 75):
        toks = torch.randint(3, 500, (n,), generator=g).tolist()
        row = [BOS] + toks + [EOS]
        row += [pad] * (T - len(row))
        rows.append(row)
    return torch.tensor(rows, dtype=torch.long)


class FakeTokenizer:
    """What encode_prompt asks of a CLIPTokenizer, answering with fixed ids per prompt."""

    model_max_length = T

    def __init__(self, table):
        self.table = table

    def __call__(self, prompt, padding=None, max_length=None, truncation=None, return_tensors=None):
        prompt = [prompt] if isinstance(prompt, str) else prompt
        return types.SimpleNamespace(input_ids=torch.stack([self.table[p] for p in prompt]))

    def batch_decode(self, ids):
        return ["" for _ in ids]


def file_key(k):
    """A state dict key as SDXL's checkpoint files name it: under text_model.,
    except the projection."""
    return k if k.startswith("text_model.") or k == "text_projection.weight" else "text_model." + k


def keys_file(path, model):
    """Each key as a checkpoint file names it, with its shape."""
    with open(path, "w") as f:
        for k, v in model.state_dict().items():
            f.write("%s [%s]\n" % (file_key(k), ",".join(str(d) for d in v.shape)))


def main():
    os.makedirs(OUT, exist_ok=True)
    torch.manual_seed(0)
    l = CLIPTextModel(tiny_config(3, "quick_gelu", 32)).eval()
    g = CLIPTextModelWithProjection(tiny_config(2, "gelu", 48)).eval()
    randomize(l, 1)
    randomize(g, 2)
    # as a diffusers folder holds them: text_encoder/ and text_encoder_2/, each a
    # config.json and a model.safetensors in the hub's naming (text_model.* for
    # both classes, as SDXL's files and transformers 4 have them; transformers 5
    # names a fresh CLIPTextModel's keys without the prefix but loads these)
    for name, m in (("text_encoder", l), ("text_encoder_2", g)):
        d = os.path.join(OUT, name)
        os.makedirs(d, exist_ok=True)
        m.config.architectures = [type(m).__name__]
        m.config.save_pretrained(d)
        safetensors.torch.save_file({file_key(k): v.contiguous() for k, v in m.state_dict().items()},
                                    os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
        back, info = type(m).from_pretrained(d, output_loading_info=True)
        assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
        for k, v in m.state_dict().items():
            assert torch.equal(back.state_dict()[k], v), k

    ids_l, ids_g = prompts(EOS), prompts(0)
    out = {"ids_l": ids_l.float(), "ids_g": ids_g.float()}
    with torch.no_grad():
        lo = l(ids_l, output_hidden_states=True)
        go = g(ids_g, output_hidden_states=True)
        # hidden_states: the embeddings, then each layer's output (before final_layer_norm)
        assert len(lo.hidden_states) == 4 and len(go.hidden_states) == 3
        out["l.hidden_penultimate"] = lo.hidden_states[-2]
        out["l.last_hidden_state"] = lo.last_hidden_state
        out["l.pooler_output"] = lo.pooler_output
        out["g.hidden_penultimate"] = go.hidden_states[-2]
        out["g.last_hidden_state"] = go.last_hidden_state
        out["g.text_embeds"] = go.text_embeds

        # the first-EOS rule (a config whose eos_token_id is not 2): token 300 ends
        # the prompt, 505 (higher) comes before it, 300 pads after it
        first = torch.tensor([[BOS, 17, 505, 40, 300] + [300] * (T - 5),
                              [BOS] + [505] * 9 + [300] + [0] * (T - 11)], dtype=torch.long)
        g.text_model.eos_token_id = 300
        out["ids_first"] = first.float()
        out["g.text_embeds_first"] = g(first).text_embeds
        g.text_model.eos_token_id = 2
        assert not torch.allclose(out["g.text_embeds_first"][1], g(first).text_embeds[1])

        # SDXL's prompt embeddings from diffusers' own encode_prompt
        names = ["p%d" % i for i in range(4)]
        pipe = types.SimpleNamespace(tokenizer=FakeTokenizer(dict(zip(names, ids_l))), text_encoder=l,
                                     tokenizer_2=FakeTokenizer(dict(zip(names, ids_g))), text_encoder_2=g,
                                     config=types.SimpleNamespace(force_zeros_for_empty_prompt=True))
        pe, _, pooled, _ = StableDiffusionXLPipeline.encode_prompt(pipe, names, device=torch.device("cpu"),
                                                                    num_images_per_prompt=1,
                                                                    do_classifier_free_guidance=False)
        assert pe.shape == (4, T, 64) and pooled.shape == (4, 48)
        assert torch.equal(pe, torch.cat([out["l.hidden_penultimate"], out["g.hidden_penultimate"]], -1))
        out["sdxl.prompt_embeds"] = pe
        out["sdxl.pooled_prompt_embeds"] = pooled
        # clip_skip 1: hidden_states[-3] of each (the first two prompts)
        pe1, _, _, _ = StableDiffusionXLPipeline.encode_prompt(pipe, names[:2], device=torch.device("cpu"),
                                                               num_images_per_prompt=1,
                                                               do_classifier_free_guidance=False, clip_skip=1)
        assert torch.equal(pe1, torch.cat([lo.hidden_states[-3][:2], go.hidden_states[-3][:2]], -1))
        out["sdxl.prompt_embeds_clip_skip_1"] = pe1
    safetensors.torch.save_file({k: v.float().contiguous() for k, v in out.items()}, os.path.join(OUT, "outputs.safetensors"))

    # the full SDXL encoders' keys, from the configs of its text_encoder and text_encoder_2
    full_l = CLIPTextConfig(vocab_size=49408, hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                            num_attention_heads=12, max_position_embeddings=77, hidden_act="quick_gelu",
                            projection_dim=768)
    full_g = CLIPTextConfig(vocab_size=49408, hidden_size=1280, intermediate_size=5120, num_hidden_layers=32,
                            num_attention_heads=20, max_position_embeddings=77, hidden_act="gelu", projection_dim=1280)
    with torch.device("meta"):
        keys_file(os.path.join(OUT, "sdxl_l_keys.txt"), CLIPTextModel(full_l))
        keys_file(os.path.join(OUT, "sdxl_g_keys.txt"), CLIPTextModelWithProjection(full_g))

    with open(os.path.join(OUT, "VERSIONS.txt"), "w") as f:
        f.write("made by tests/ref/make_clip_ref.py with\n")
        f.write("python %s\n" % sys.version.split()[0])
        for mod in (torch, transformers, diffusers, safetensors):
            f.write("%s %s\n" % (mod.__name__.split(".")[0], getattr(mod, "__version__", "?")))


if __name__ == "__main__":
    main()
