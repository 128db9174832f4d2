"""Reference data for ckrun's T5 tokenizer (vm/text/spm_tok.c, ck.t5_tokenizer):
writes tests/data/tokenizer/t5_small/ and the seed corpus of its fuzz harness
(tests/fuzz/corpus/spm/).

The reference is transformers 5's T5Tokenizer, what Flux.1's pipelines use for
their second text encoder. google/t5-v1_1-xxl's spiece.model (32,000 pieces)
is too big to keep here, so this script trains a small sentencepiece unigram
model with T5's settings (pad 0, eos 1, unk 2, no bos, the nmt_nfkc
normalizer, 100 extra ids added by transformers) on a small generated caption
corpus, and saves it twice:

  spiece/     spiece.model and a tokenizer_config.json as google's T5 folders
              hold them;
  json/       tokenizer.json and tokenizer_config.json, as transformers 5's
              save_pretrained writes them (no spiece.model).

For each test string it records the ids transformers gives (with </s>), and
for some the frames of max_length 512, 256, 77, 16, 2 and 1 (truncated, </s>
last, padded with <pad>) with their attention masks. It checks that both
folders, and the tokenizer.json with a transformers-4-style normalizer and
pre-tokenizer (which transformers 5 ignores, as ckrun does), give the same ids.

    python3 -m venv /tmp/venv-t5 && /tmp/venv-t5/bin/pip install transformers sentencepiece protobuf
    /tmp/venv-t5/bin/python tests/ref/make_t5_tokenizer_ref.py
"""

import io
import json
import os
import random
import shutil
import sys
import tempfile

import sentencepiece as spm
import tokenizers
import transformers
from transformers import T5Tokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "data", "tokenizer", "t5_small")
FUZZ = os.path.join(HERE, "..", "fuzz", "corpus", "spm")

SUBJECTS = ("a cat|a black cat|a dog|a golden retriever|an old man|a young woman|two children|a red car|a castle|"
            "a robot|the city skyline|a bowl of ramen|a mountain lake|a wooden boat|an astronaut|a dragon|"
            "a lighthouse|a bicycle|a portrait of a girl|a bouquet of flowers|a steam train|a sleeping fox|"
            "a knight in armor|a cup of coffee|a vintage camera|a street musician|a waterfall|a hummingbird|"
            "an owl|a spaceship|a samurai|a bakery|a library|a ballerina|a lion|a teapot|a jellyfish").split("|")
VERBS = ("sitting on|standing next to|running through|flying over|floating above|hiding behind|looking at|"
         "walking along|painted on|reflected in|dancing in|resting under|emerging from|surrounded by").split("|")
PLACES = ("a sofa|the beach|a forest|the moon|a busy street|a snowy field|an ancient temple|the ocean|"
          "a neon-lit alley|a wheat field|a rainy window|the desert|a cathedral|a subway station|a garden|"
          "a misty valley|a coral reef|a rooftop|a market|an abandoned factory").split("|")
STYLES = ("oil painting|watercolor|digital art|35mm photograph|studio lighting|cinematic|highly detailed|4k|"
          "8k uhd|trending on artstation|by greg rutkowski|in the style of ukiyo-e|black and white|bokeh|"
          "golden hour|low poly|pixel art|concept art|volumetric fog|soft focus|wide angle|macro shot|"
          "dramatic shadows|pastel colors|isometric|photorealistic|masterpiece|best quality").split("|")
FOREIGN = ["ein Hund im Park", "une maison au bord de la mer", "un gato negro", "die Katze schläft",
           "château médiéval", "café crème", "naïve façade", "Straße in München", "el niño pequeño", "años",
           "über", "Übermensch", "東京の夜景", "猫が寝ている", "富士山", "一只可爱的小猫", "北京", "красивый закат",
           "Москва", "καλημέρα", "Αθήνα", "서울의 밤", "ñandú", "garçon", "fiancée", "Zürich", "Kraków", "İstanbul"]
EMOJI = ["😀", "🐱", "🌸", "🚀", "❤️", "👍🏽", "🎨", "✨"]


def corpus(n=8000, seed=1):
    r = random.Random(seed)
    out = []
    for _ in range(n):
        s = f"{r.choice(SUBJECTS)} {r.choice(VERBS)} {r.choice(PLACES)}"
        for _ in range(r.randint(0, 4)):
            s += ", " + r.choice(STYLES)
        if r.random() < 0.3:
            s += ", " + r.choice(FOREIGN)
        if r.random() < 0.05:
            s += " " + r.choice(EMOJI)
        if r.random() < 0.2:
            s = s.capitalize()
        if r.random() < 0.1:
            s += "."
        if r.random() < 0.1:
            s += f" {r.randint(0, 2024)}"
        out.append(s)
    return out


def train(lines, vocab_size, rule="nmt_nfkc", extra=None):
    m = io.BytesIO()
    args = dict(sentence_iterator=iter(lines), model_writer=m, model_type="unigram", vocab_size=vocab_size,
                character_coverage=0.9995, pad_id=0, eos_id=1, unk_id=2, bos_id=-1, split_by_whitespace=True,
                split_by_unicode_script=True, split_by_number=True, max_sentencepiece_length=16, num_threads=1,
                seed_sentencepiece_size=100000, minloglevel=2, hard_vocab_limit=False, shuffle_input_sentence=False)
    if rule.endswith(".tsv"):
        args["normalization_rule_tsv"] = rule
    else:
        args["normalization_rule_name"] = rule
    args.update(extra or {})
    spm.SentencePieceTrainer.train(**args)
    return m.getvalue()


def test_strings():
    r = random.Random(7)
    s = [
        "", " ", "   ", "\t\n\r", "a", "A", "a cat sitting on a sofa", "A photo of an astronaut riding a horse on mars",
        "  leading and trailing  ", "many     spaces   between", "tabs\tand\nnewlines\r\nhere", "a\u00a0b", "a\u3000b",
        "a\u2028b\u2029c", "a\x0bb\x0cc", "a\x1cb\x1dc\x1ee\x1ff", "nel\x85char", "ogham\u1680space",
        "thin\u2009space\u202fnarrow\u205fmath", "zero\u200bwidth", "soft\u00adhyphen", "bom\ufeffhere",
        "mongolian\u180evowel", "nul\x00char", "bell\x07 esc\x1b[0m", "del\x7fchar", "control\x01\x1fchars",
        "Café crème, naïve façade — “quoted” ‘single’ …", "cafe\u0301 combining", "a\u0300\u0301\u0302\u0303 stacked",
        "\u00e0\u0301\u0302 precomposed then marks", "Ａ\u0301 fullwidth with a mark", "e\u0301\u0301 two marks",
        "Ångström A\u030angstro\u0308m", "Straße in München ÜBER", "İstanbul ıi", "ǅ ǆ Ǆ", "ΟΔΟΣ σς", "Москва ПРИВЕТ",
        "東京の夜景、富士山。", "一只可爱的小猫🐱🌸", "日本語のテキスト ひらがな カタカナ", "한국어 텍스트", "\u1100\u1161 jamo",
        "ｱﾞ halfwidth ｶﾀｶﾅ", "ｆｕｌｌｗｉｄｔｈ ＡＢＣ １２３", "ﬁnance ﬂour ﬀ", "①②③ ⑩", "㍿ ㌔", "™ ℃ ℉ №", "½ ¼ ¾ x² y³",
        "Ⅻ ⅻ", "ﷺ", "عربي", "עברית", "हिन्दी अनुच्छेद", "क्षत्रिय", "ไทย", "🇩🇪 flag 🇯🇵🇺🇸", "👍🏽❤️ emoji",
        "👨\u200d👩\u200d👧 family", "1️⃣ keycap", "✨sparkles✨", "😂😂😂", "\U0001fae8 shaking face", "𠀀𠀁 ext-b",
        "private\ue000use", "unassigned\u0378char", "replacement\ufffdchar",
        "\u2581literal meta", "a\u2581b", "\u2581\u2581", "a\u2581", "\u2581", "x \u2581 y",
        "</s>", "</s> in text", "x</s>y", "a <extra_id_0> b", "<extra_id_99><extra_id_0>", "<extra_id_100>",
        "<extra_id_", "<pad><unk></s>", "＜/s＞ fullwidth", "＜extra_id_0＞", "＜pad＞＜unk＞", "</s</s>>", "<</s>",
        "don't I'm you're", "rock'n'roll", "(masterpiece:1.2), ((best quality)), [tag]", "a_b_c snake_case",
        "e.g. U.S.A. $100 50% a+b=c", "<html>&amp;</html>", "\"quoted\" «guillemets» „German“", "—–-…·•",
        "!!!???...", "1234567890 3.14159 1,000,000", "2024-01-01T12:00:00Z", "https://example.com/a?b=c#d",
        "user@example.com", "#hashtag @mention", "C:\\path\\to\\file", "x" * 60, "ab" * 40, "ééééé" * 10,
        "supercalifragilisticexpialidocious antidisestablishmentarianism",
    ]
    long_caption = ", ".join(r.choice(STYLES) for _ in range(200))
    s.append(long_caption)
    s.append(" ".join(["word"] * 600))
    s.append(" ".join(r.choice(SUBJECTS) + " " + r.choice(VERBS) + " " + r.choice(PLACES) for _ in range(120)))
    s.append("".join(r.choice(FOREIGN) for _ in range(80)))
    pool = (list("abcXYZ019 ,.!'\"-_()[]\t\n") +
            ["é", "ß", "İ", "ı", "Σ", "ς", "中", "日", "ー", "한", "я", "Ж", "ｱ", "ﾞ", "Ａ", "１", "＜", "＞", "／",
             "\u0301", "\u0300", "\u0308", "\u200b", "\u200d", "\x00", "\x7f", "\x85", "\u00a0", "\u3000",
             "\u1680", "\u2028", "\u202f", "\u2581", "🙂", "👍", "🏽", "\ufe0f", "½", "²", "ſ", "ﬁ", "™", "①",
             "ﷺ", "\r\n", "</s>", "<pad>", "<unk>", "<extra_id_0>", "<extra_id_7>", "extra_id", "a cat", "  "])
    for _ in range(250):
        s.append("".join(r.choice(pool) for _ in range(r.randint(1, 40))))
    return s


FRAME_LENGTHS = (512, 256, 77, 16, 2, 1)


def main():
    lines = corpus()
    model = train(lines, 1500)
    tmp = tempfile.mkdtemp()
    try:
        shutil.rmtree(OUT, ignore_errors=True)
        sp_dir, js_dir = os.path.join(OUT, "spiece"), os.path.join(OUT, "json")
        os.makedirs(sp_dir)
        with open(os.path.join(sp_dir, "spiece.model"), "wb") as f:
            f.write(model)
        with open(os.path.join(sp_dir, "tokenizer_config.json"), "w") as f:
            json.dump({"eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>", "extra_ids": 100,
                       "model_max_length": 512, "tokenizer_class": "T5Tokenizer"}, f, indent=1)
        tok = T5Tokenizer.from_pretrained(sp_dir)
        tok.save_pretrained(js_dir)
        assert not os.path.exists(os.path.join(js_dir, "spiece.model")), "transformers 5 saved an spiece.model"
        tok_json = T5Tokenizer.from_pretrained(js_dir)

        # the same tokenizer.json with transformers 4's normalizer and pre-tokenizer
        v4_dir = os.path.join(tmp, "v4")
        os.makedirs(v4_dir)
        with open(os.path.join(js_dir, "tokenizer.json"), encoding="utf-8") as f:
            tj = json.load(f)
        tj["normalizer"] = {"type": "Sequence", "normalizers": [
            tj["normalizer"], {"type": "Strip", "strip_left": False, "strip_right": True},
            {"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": "\u2581"}]}
        tj["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True}
        with open(os.path.join(v4_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(tj, f, ensure_ascii=False)
        shutil.copy(os.path.join(js_dir, "tokenizer_config.json"), v4_dir)
        tok_v4 = T5Tokenizer.from_pretrained(v4_dir)

        cases = []
        for i, text in enumerate(test_strings()):
            ids = tok(text)["input_ids"]
            for other, name in ((tok_json, "json/"), (tok_v4, "the transformers-4-style tokenizer.json")):
                got = other(text)["input_ids"]
                assert got == ids, f"{name} differs on {text!r}: {got} != {ids}"
            c = {"text": text, "ids": ids}
            if len(ids) > 60 or i % 17 == 0:
                c["frames"] = []
                for L in FRAME_LENGTHS:
                    e = tok(text, max_length=L, padding="max_length", truncation=True)
                    c["frames"].append({"max_length": L, "ids": e["input_ids"], "mask": e["attention_mask"]})
            cases.append(c)

        ref = {
            "versions": {"python": sys.version.split()[0], "transformers": transformers.__version__,
                         "tokenizers": tokenizers.__version__, "sentencepiece": spm.__version__},
            "vocab_size": len(tok), "eos": tok.eos_token_id, "pad": tok.pad_token_id, "unk": tok.unk_token_id,
            "extra_id_0": tok.convert_tokens_to_ids("<extra_id_0>"),
            "cases": cases,
        }
        with open(os.path.join(OUT, "cases.json"), "w", encoding="utf-8") as f:
            json.dump(ref, f, ensure_ascii=False, separators=(",", ":"))
        with open(os.path.join(OUT, "VERSIONS.txt"), "w") as f:
            f.write(f"python {ref['versions']['python']}\ntransformers {transformers.__version__} (T5Tokenizer)\n"
                    f"tokenizers {tokenizers.__version__}\nsentencepiece {spm.__version__} (trained the model)\n")

        # fuzz seeds: small models, one with no character map and one with a
        # small one compiled from a few rules
        os.makedirs(FUZZ, exist_ok=True)
        small = [l for l in lines if l.isascii()][:300]
        with open(os.path.join(FUZZ, "identity.model"), "wb") as f:
            f.write(train(small, 90, "identity"))
        rules = os.path.join(tmp, "rules.tsv")
        with open(rules, "w") as f:
            f.write("41\t61\n"            # A -> a
                    "FF21\t61\n"          # fullwidth A -> a
                    "61 301\tE1\n"        # a + combining acute -> á
                    "3000\t20\n"          # ideographic space -> space
                    "200B\t\n"            # zero width space -> nothing
                    "FB01\t66 69\n")      # fi ligature -> f i
        with open(os.path.join(FUZZ, "rules.model"), "wb") as f:
            f.write(train(small, 90, rules))
        print(f"{len(cases)} cases, vocab {len(tok)}, model {len(model)} bytes")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
