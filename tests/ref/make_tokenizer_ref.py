"""Reference data for ckrun's CLIP tokenizer (vm/text/clip_bpe.c): writes
tests/data/tokenizer/.

The reference is transformers' slow CLIPTokenizer (transformers 4.x, with ftfy
NOT installed, so that it cleans text with its BasicTokenizer). transformers 5
no longer has it (its CLIPTokenizer is the Rust one, which cleans differently),
so this script runs in a venv of its own:

    python3 -m venv /tmp/venv-tf4 && /tmp/venv-tf4/bin/pip install transformers==4.57.1
    /tmp/venv-tf4/bin/python tests/ref/make_tokenizer_ref.py [--bpe PATH] [--full-out FILE]

--bpe: open_clip's bpe_simple_vocab_16e6.txt.gz (default: the one in
/work/venv-ref's open_clip). From its first SMALL_MERGES merges it builds a
small CLIP-style tokenizer (every byte is a token, so every text is
representable), saved as two tokenizer folders (clip_l: pad <|endoftext|> in
special_tokens_map.json; clip_g: pad "!" in tokenizer_config.json, as SDXL's
two tokenizers) and as a small .txt.gz in the bpe file's own format. For each
test string it saves the slow tokenizer's tokens and ids, the 77-token frames
(truncated and padded) of both folders, and, for some, kohya-ss sd-scripts'
chunks for --max_token_length 150 and 225 (computed here as its train_util
get_input_ids computes them from the tokenizer's output).

--full-out: also tokenizes every string with the full vocabulary built from
the real bpe file and writes the ids there (not committed: the check that
ckrun gives the same with the real file is run by hand, see
tests/ref/full_vocab_check.lua).
"""

import argparse
import glob
import gzip
import json
import os
import random
import sys

import transformers
from transformers import CLIPTokenizer

SMALL_MERGES = 3000
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "tokenizer")


def bytes_to_unicode():
    # CLIP's table, as CLIP's simple_tokenizer defines it
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


def clip_vocab(merges):
    """The vocabulary CLIP builds from its merges."""
    vocab = list(bytes_to_unicode().values())
    vocab = vocab + [v + "</w>" for v in vocab]
    for m in merges:
        vocab.append("".join(m))
    vocab.extend(["<|startoftext|>", "<|endoftext|>"])
    return dict(zip(vocab, range(len(vocab))))


def write_folder(path, vocab, merges, pad, pad_in):
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False, separators=(",", ":"))
    with open(os.path.join(path, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n")
        for a, b in merges:
            f.write(f"{a} {b}\n")
    if pad_in == "special_tokens_map":
        cfg = {"bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>", "pad_token": pad}
        with open(os.path.join(path, "special_tokens_map.json"), "w") as f:
            json.dump(cfg, f, indent=1)
        with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
            json.dump({"model_max_length": 77, "tokenizer_class": "CLIPTokenizer"}, f, indent=1)
    else:
        tok = lambda s: {"__type": "AddedToken", "content": s, "lstrip": False, "normalized": True, "rstrip": False, "single_word": False}
        cfg = {"bos_token": tok("<|startoftext|>"), "eos_token": tok("<|endoftext|>"), "unk_token": tok("<|endoftext|>"),
               "pad_token": tok(pad), "model_max_length": 77, "tokenizer_class": "CLIPTokenizer"}
        with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
            json.dump(cfg, f, indent=1)


def kohya_chunks(tok, text, max_token_length):
    """kohya-ss sd-scripts' chunks: the caption padded/truncated to
    max_token_length + 2, cut into 77s, with its fix-ups when pad != eos."""
    L = max_token_length + 2
    ids = tok(text, padding="max_length", truncation=True, max_length=L).input_ids
    m = tok.model_max_length
    out = []
    for i in range(1, L - m + 2, m - 2):
        chunk = [ids[0]] + ids[i:i + m - 2] + [ids[-1]]
        if tok.pad_token_id != tok.eos_token_id:
            if chunk[-2] != tok.eos_token_id and chunk[-2] != tok.pad_token_id:
                chunk[-1] = tok.eos_token_id
            if chunk[1] == tok.pad_token_id:
                chunk[1] = tok.eos_token_id
        out.append(chunk)
    return out


TAGS = ("1girl, 2girls, 1boy, solo, long hair, short hair, looking at viewer, smile, open mouth, blush, "
        "blue eyes, red eyes, brown hair, black hair, blonde hair, twintails, ponytail, hat, dress, skirt, "
        "thighhighs, school uniform, serafuku, holding, standing, sitting, outdoors, indoors, sky, cloud, "
        "day, night, cherry blossoms, masterpiece, best quality, highres, absurdres, simple background, "
        "white background, upper body, full body, cowboy shot, from side, from behind, hair ornament, "
        "jewelry, earrings, (masterpiece:1.2), [best quality], {detailed}, score_9, score_8_up, rating:safe, "
        "artist:foo_bar, 2024, \\(cosplay\\), :d, ^_^, >_<, o_o").split(", ")


def test_strings():
    s = [
        "", " ", "   ", "\t\n\r", "a", "A", "hello", "Hello World", "HELLO WORLD", "hello world.",
        "a photo of a cat", "A photo of an astronaut riding a horse on mars",
        "  leading spaces", "trailing spaces   ", "many     spaces   between", "tabs\tand\nnewlines\r\nhere",
        "a\u00a0b", "a\u3000b", "a\u2028b\u2029c", "a\x0bb\x0cc", "a\x1cb\x1dc\x1ee\x1ff", "a\x85b",
        "nul\x00char", "bell\x07 esc\x1b[0m", "zero\u200bwidth", "soft\u00adhyphen", "bom\ufeffhere",
        "private\ue000use", "unassigned\u0378char", "replacement\ufffdchar", "lone \u0301 accent",
        "café", "cafe\u0301", "naïve résumé", "Ångström", "A\u030angstro\u0308m", "ÀÉÎÕÜ àéîõü", "ñandú",
        "İstanbul", "ISTANBUL", "ıi İI", "DİYARBAKIR", "Straße", "STRASSE", "\u1e9e", "GROẞE",
        "ΟΔΟΣ", "Σ", "ΣΑΣ.", "ὈΔΥΣΣΕΎΣ", "αβγ ΑΒΓ", "Москва", "ПРИВЕТ мир", "Ёлка", "Україна",
        "中文字符", "我爱北京天安门", "日本語のテキスト", "ひらがな カタカナ", "한국어", "\u1112\u1161\u11ab",
        "漢字kanji混合", "𠀀𠀁 ext-b", "\U00031350 ext-h", "\U0001fae8 shaking face", "ＡＢＣ１２３", "ﬁnance ﬂour",
        "عربي", "עברית", "हिन्दी", "ไทย", "Ελληνικά", "ǅ ǈ ǋ", "ᾼ ῌ ῼ", "\u0130\u0307",
        "1234567890", "3.14159", "1,000,000", "١٢٣", "½ ¼ ¾", "x² y³", "Ⅻ ⅻ", "①②③", "٣٫١٤",
        "don't", "I'm", "you're", "they've", "we'll", "he'd", "it's", "DON'T", "I'M HERE", "'s'", "''",
        "rock'n'roll", "o'clock", "it’s", "'ſ test", "ſ", "'S", "y'all'd've",
        "<|startoftext|>", "<|endoftext|>", "a <|endoftext|> b", "<|startoftext|>x<|endoftext|>",
        "!<|endoftext|>", "<|endoftext|><|endoftext|>", "<|ENDOFTEXT|>", "<|endoftext", "<|start\x00oftext|>",
        "🙂", "👍🏽", "🇯🇵🇺🇸", "❤️", "1️⃣", "👨‍👩‍👧", "✨sparkles✨", "🐱🐶 pets", "☕️ coffee", "😂😂😂",
        "!", "!!", "!!!", "wow!", "wow!!", "?!", "...", "…", "--", "—", "\\", "/", "@user", "#hashtag",
        "(masterpiece:1.2)", "((best quality))", "[[tag]]", "{a|b}", "a_b_c", "snake_case_name", "a-b-c",
        "e.g.", "U.S.A.", "$100", "50%", "a+b=c", "<html>", "&amp;", "\"quoted\"", "«guillemets»", "„German“",
        "score_9, score_8_up, score_7_up", "rating:safe", "artist:foo_bar",
        "abcdefghijklmnopqrstuvwxyz" * 4, "z" * 300, "ab" * 100, "ééééé" * 20,
    ]
    # captions of exactly n tokens ("a" is one), at the edges of the 77 frame and of kohya's chunks
    for n in (74, 75, 76, 149, 150, 151, 224, 225, 226):
        s.append(" ".join(["a"] * n))
        s.append(" ".join(["a"] * (n - 1)) + "!")
    rnd = random.Random(1234)
    for _ in range(40):
        k = rnd.randint(3, 30)
        s.append(", ".join(rnd.choice(TAGS) for _ in range(k)))
    words = ("the a of in on with and cat dog girl boy tree river mountain sky blue red green golden "
             "beautiful detailed painting photo portrait landscape city night light shadow").split()
    for n in (60, 80, 120, 160, 200, 260, 400):
        s.append(" ".join(rnd.choice(words) for _ in range(n)))
    pool = (list("abcXYZ019 ,.!'\"-_()[]\t\n") + ["é", "ß", "İ", "ı", "Σ", "ς", "中", "日", "ー", "한", "я", "Ж",
            "\u0301", "\u200b", "\u200d", "\x00", "\x7f", "\u00a0", "\u3000", "🙂", "👍", "🏽", "\ufe0f",
            "½", "²", "٣", "ſ", "ﬁ", "<|endoftext|>", "'s", "'LL", "\ue000", "\U000e0001", "\u2028"])
    for _ in range(80):
        s.append("".join(rnd.choice(pool) for _ in range(rnd.randint(1, 60))))
    return s


def load(path):
    tok = CLIPTokenizer.from_pretrained(path)
    assert tok.__class__.__name__ == "CLIPTokenizer" and tok.fix_text is None, "the slow tokenizer without ftfy"
    return tok


def main():
    ap = argparse.ArgumentParser()
    found = glob.glob("/work/venv-ref/lib/python3*/site-packages/open_clip/bpe_simple_vocab_16e6.txt.gz")
    ap.add_argument("--bpe", default=found[0] if found else None)
    ap.add_argument("--full-out", default=None)
    a = ap.parse_args()
    lines = gzip.open(a.bpe).read().decode("utf-8").split("\n")
    merges = [tuple(m.split()) for m in lines[1:49152 - 256 - 2 + 1]]
    small = merges[:SMALL_MERGES]
    os.makedirs(OUT, exist_ok=True)
    vocab = clip_vocab(small)
    write_folder(os.path.join(OUT, "clip_l"), vocab, small, "<|endoftext|>", "special_tokens_map")
    write_folder(os.path.join(OUT, "clip_g"), vocab, small, "!", "tokenizer_config")
    # the bpe file's format: a header line, then the merges
    with gzip.GzipFile(os.path.join(OUT, "bpe_small.txt.gz"), "wb", mtime=0) as f:
        f.write(("\n".join([lines[0]] + [" ".join(m) for m in small]) + "\n").encode("utf-8"))
    tl, tg = load(os.path.join(OUT, "clip_l")), load(os.path.join(OUT, "clip_g"))
    assert tl.pad_token_id == tl.eos_token_id and tg.pad_token_id == 0

    cases = []
    for i, text in enumerate(test_strings()):
        c = {"text": text,
             "tokens_l": tl.tokenize(text),
             "ids_l": tl(text, add_special_tokens=False).input_ids,
             "ids_g": tg(text, add_special_tokens=False).input_ids,
             "l77": tl(text, padding="max_length", truncation=True, max_length=77).input_ids,
             "g77": tg(text, padding="max_length", truncation=True, max_length=77).input_ids}
        if len(c["ids_l"]) > 80:
            del c["tokens_l"]  # long captions repeat the words of shorter ones: their ids suffice
        if (len(c["ids_l"]) > 60 and i % 3 == 0) or i % 40 == 0 or text.startswith("a a a"):
            c["l150"], c["g150"] = kohya_chunks(tl, text, 150), kohya_chunks(tg, text, 150)
            c["l225"], c["g225"] = kohya_chunks(tl, text, 225), kohya_chunks(tg, text, 225)
        cases.append(c)
    with open(os.path.join(OUT, "cases.json"), "w", encoding="utf-8") as f:
        json.dump({"bos": tl.bos_token_id, "eos": tl.eos_token_id, "vocab_size": len(vocab), "cases": cases}, f,
                  ensure_ascii=False, separators=(",", ":"))
    with open(os.path.join(OUT, "VERSIONS.txt"), "w") as f:
        f.write(f"python {sys.version.split()[0]}\ntransformers {transformers.__version__} (slow CLIPTokenizer, "
                f"ftfy not installed)\nbpe: first {SMALL_MERGES} merges of open_clip's bpe_simple_vocab_16e6.txt.gz\n")
    print(f"{len(cases)} cases, vocab {len(vocab)}")

    if a.full_out:
        d = a.full_out + ".d"  # the full folder, for the by-hand check of ckrun's folder loader
        write_folder(d, clip_vocab(merges), merges, "<|endoftext|>", "special_tokens_map")
        tf = load(d)
        full = [tf(c["text"], add_special_tokens=False).input_ids for c in cases]
        with open(a.full_out, "w") as f:
            json.dump({"texts": [c["text"] for c in cases], "ids": full}, f, ensure_ascii=True)
        print(f"full vocabulary ids of {len(full)} strings in {a.full_out}")


if __name__ == "__main__":
    main()
