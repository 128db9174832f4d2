"""Reference data for ckrun's CLIP tokenizer (vm/text/clip_bpe.c,
vm/text/ftfy.c): writes tests/data/tokenizer/ and vm/text/ftfy_tables.h.

The reference is transformers' slow CLIPTokenizer (transformers 4.x), which
cleans a caption with ftfy's fix_text when ftfy is installed (as in kohya-ss
sd-scripts' installs) and with its BasicTokenizer when it is not.
transformers 5 no longer has it (its CLIPTokenizer is the Rust one, which
cleans differently and never runs ftfy), so the modes run in venvs of their
own; VERSIONS.txt records what made each file:

    python3 -m venv /tmp/venv-tf4 && /tmp/venv-tf4/bin/pip install transformers==4.57.1 ftfy==6.3.1
    /tmp/venv-tf4/bin/python tests/ref/make_tokenizer_ref.py [--bpe PATH] [--full-out FILE]
    /tmp/venv-tf4/bin/python tests/ref/make_tokenizer_ref.py --ftfy [--full-bpe PATH --full-out FILE]
    /tmp/venv-tf4/bin/python tests/ref/make_tokenizer_ref.py --ftfy-tables
    python3 -m venv /tmp/venv-tf5 && /tmp/venv-tf5/bin/pip install 'transformers>=5'
    /tmp/venv-tf5/bin/python tests/ref/make_tokenizer_ref.py --tf5
    /tmp/venv-tf4/bin/python tests/ref/make_tokenizer_ref.py --fuzz-corpus

Default mode (ftfy hidden from transformers, so that it takes its no-ftfy
path): --bpe is open_clip's bpe_simple_vocab_16e6.txt.gz (default: the one in
/work/venv-ref's open_clip). From its first SMALL_MERGES merges it builds a
small CLIP-style tokenizer (every byte is a token, so every text is
representable), saved as two tokenizer folders (clip_l: pad <|endoftext|> in
special_tokens_map.json; clip_g: pad "!" in tokenizer_config.json, as SDXL's
two tokenizers) and as a small .txt.gz in the bpe file's own format. For each
test string it saves the slow tokenizer's tokens and ids, the 77-token frames
(truncated and padded) of both folders, and, for some, kohya-ss sd-scripts'
chunks for --max_token_length 150 and 225 (computed here as its train_util
get_input_ids computes them from the tokenizer's output). --full-out: also
tokenizes every string with the full vocabulary built from the real bpe file
and writes the ids there (not committed: the check that ckrun gives the same
with the real file is run by hand, see tests/ref/full_vocab_check.lua).

--ftfy: ftfy_cases.json: the hard captions (curly quotes, fullwidth forms,
HTML entities, ligatures, mojibake, CJK, emoji, format and control
characters, long captions) and the default mode's strings, tokenized by the
clip_l and clip_g folders with ftfy (the text after fix_text, whitespace
cleanup and lower-casing, and the ids) and, for the hard captions, without it
(ids_g and none_g are left out where they equal ids_l and none_l).
--full-bpe/--full-out: the same captions' ids with the full vocabulary, with
and without ftfy, for the by-hand check (tests/ref/full_vocab_check.lua).

--ftfy-tables: vm/text/ftfy_tables.h, the data ftfy's fixes use: its
character classes for mojibake detection, the single-byte encodings it
re-encodes text in (Python's codecs, with ftfy's "sloppy" variants), its
ligatures and its HTML entity names.

--fuzz-corpus: tests/fuzz/corpus/tokenizer, the seeds of
tests/fuzz/fuzz_tokenizer.c (made from the small vocabulary and the hard
captions; needs neither transformers version).

--tf5: clip_l_tf5/ and clip_g_tf5/: the two folders loaded by transformers 5's
CLIPTokenizer and saved again, as transformers 5 saves a diffusers folder's
tokenizer: tokenizer.json and tokenizer_config.json only (tokenizer.json
written back without indentation, to keep it small; its content is
unchanged).
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

VERSIONS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "tokenizer", "VERSIONS.txt")

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


def load(path, ftfy=False):
    """The slow tokenizer of a folder, with ftfy or (ftfy hidden from its
    import, as when it is not installed) without."""
    saved = sys.modules.get("ftfy", False)
    if not ftfy:
        sys.modules["ftfy"] = None  # `import ftfy` raises ImportError
    try:
        tok = CLIPTokenizer.from_pretrained(path)
    finally:
        if saved is False:
            sys.modules.pop("ftfy", None)
        else:
            sys.modules["ftfy"] = saved
    assert tok.__class__.__name__ == "CLIPTokenizer" and (tok.fix_text is None) == (not ftfy), "the slow tokenizer"
    return tok


def set_version(key, line):
    """VERSIONS.txt: the line that starts with key replaced (or added)."""
    lines = open(VERSIONS).read().splitlines() if os.path.exists(VERSIONS) else []
    lines = [l for l in lines if not l.startswith(key)] + [key + line]
    with open(VERSIONS, "w") as f:
        f.write("\n".join(sorted(lines)) + "\n")


def hard_captions():
    """Captions where ftfy's fix_text, the no-ftfy cleanup and the vocabulary
    disagree: each kind several ways, then random mixtures of the characters
    mojibake is made of."""
    s = [
        # curly and other quotes
        "it\u2019s a \u201cquoted\u201d word", "\u2018single\u2019 and \u201bodd\u201a", "\u201eGerman\u201c and \u201fodd\u201d",
        "don\u2019t stop", "rock \u2019n\u2019 roll", "\u02bcokina", "\u00abguillemets\u00bb \u2039one\u203a", "\u2033 \u2032 primes",
        # fullwidth and halfwidth forms
        "\uff21\uff22\uff23\uff11\uff12\uff13", "\uff2c\uff2f\uff35\uff24\u3000\uff2e\uff2f\uff29\uff33\uff25\uff33",
        "\uff08masterpiece\uff1a\uff11\uff0e\uff12\uff09", "\uff76\uff80\uff76\uff85 \uff83\uff9e\uff7d", "\uffe5\uff11\uff10\uff10 \uffe0\uffe1\uffe2",
        "\uff03hashtag \uff20user", "\uff5ewave\uff5e", "\u6771\u4eac\u3000\u5927\u962a", "\uff01", "\uff01\uff01 wow",
        "\uffe8 \uffed \uffee halfwidth forms", "\uff9f\uff64\uff61", "\uffa1\uffa4 hangul halfwidth",
        # HTML entities
        "Tom &amp; Jerry", "&lt;3 and &gt;_&lt;", "&quot;hi&quot; &#39;there&#39;", "&#x27;hex&#X27;", "it&#8217;s",
        "wait&hellip; what", "a&nbsp;b", "&eacute;t&eacute; &Eacute;T&Eacute;", "&EACUTE;T&EACUTE; &NTILDE;",
        "&AMP; &LT; &GT;", "&amp;amp; twice", "&amp;amp;amp; thrice", "&amp;lt;b&amp;gt;", "&#0; nul &#128; euro &#x81; c1",
        "&#x110000; &#xD800; &#1114111;", "&#65abc; &#xZZ; &#; &#x;", "&notanentity; &amp", "& amp; &amp ;",
        "<b>bold</b> &amp; tags", "first &amp;\n<i>second</i> &amp;\nthird &amp;", "line &amp;\nnext &lt;",
        "&fflig; &ffilig; &SZLIG; &szlig;", "&copy; 2024 &trade; &reg;", "&euro;5 &pound;3 &yen;9", "&#x1F600; &#128512;",
        "&#9731; &#x2603;", "&Aacute;&aacute;&AACUTE;", "&NotEqualTilde; &nLt; &ThickSpace;", "&#13;&#10;&#9;",
        "&#x80;&#x9f; &#159;", "&#65279;bom", "&#x200b;zwsp", "&ampamp; &amp;&amp; &&amp;", "&#38;amp; &#x26;lt;",
        "&amp;#39; nested numeric", "&lt;|endoftext|&gt;",
        # ligatures
        "\ufb01nance \ufb02our", "\ufb00 \ufb03 \ufb04 \ufb05 \ufb06", "\u0132sselmeer \u0133s", "\u01c4 \u01c5 \u01c6 \u01c7 \u01c8 \u01c9",
        "\u01ca \u01cb \u01cc \u01f1 \u01f2 \u01f3", "\u0149 afrikaans", "\u00e6 \u0153 \u00c6 \u0152 kept", "\ufb01NANCE", "\ufb13\ufb14 armenian",
        # mojibake: UTF-8 read as Latin-1 / Windows-1252, once and twice
        "caf\u00c3\u00a9", "na\u00c3\u00afve r\u00c3\u00a9sum\u00c3\u00a9", "\u00c3\u00bcber alles", "s\u00c3\u00b3", "voil\u00c3 le travail",
        "\u00c3  la mode", "don\u00e2\u20ac\u2122t", "\u00e2\u20ac\u0153quoted\u00e2\u20ac\x9d", "\u00e2\u20ac\u201ddash\u00e2\u20ac\u201c",
        "wait\u00e2\u20ac\u00a6", "\u00c3\u00a2\u00e2\u201a\u00ac\u00e2\u201e\u00a2", "\u00e6\u2014\u00a5\u00e6\u0153\u00ac\u00e8\u00aa\u017e",
        "\u00d0\u0178\u00d1\u20ac\u00d0\u00b8\u00d0\u00b2\u00d0\u00b5\u00d1\u201a", "\u00f0\u0178\u2122\u201a smile", "\u00e2\u0153\u201d No problems",
        "&macr;\\_(\u00e3\x83\x84)_/&macr;", "Broken text&hellip; it&#x2019;s \ufb02ubberi\ufb01c!", "\u00c3\u0192\u00c2\u00a9 double",
        "\u00c3\u0192\u00c2\u00a9t\u00c3\u0192\u00c2\u00a9", "\x93quoted\x94 c1", "\x80100 and \x85", "caf\u00e9 na\u00c3\u00afve \U0001f642",
        "\u00e4\u00b8\u00ad\u00e6\u2013\u2021", "\u00c3\u00a9\u00c3\u00a8\u00c3\u00a0", "don\u00e2\u20ac?t lossy", "caf\u00c3? lossy",
        "\u00c3\ufffd lossy", "r\u00c3\u00a9sum\u00c3\u00a9 \u2014 real dash", "\u00c2\u00a3100 and \u00c2\u00bd cup", "\u00c2 nbsp",
        "\u00d0\u00bf\u00d1\u20ac\u00d0\u00b8\u00d0\u00b2\u00d0\u00b5\u00d1\u201a \u00d0\u00bc\u00d0\u00b8\u00d1\u20ac",
        "\u0420\u045f\u0421\u0402\u0420\u0451\u0420\u0406\u0420\u00b5\u0421\u201a", "\u0432\u0402\u2122 1251", "\u00ce\u00ba\u00ce\u00b1\u00ce\u00bb\u00ce\u00b7",
        "\u039e\u038a\u039e\u00b1 1253", "\u221a\u00a9t\u221a\u00a9 macroman", "\u251c\u00ae cp437", "\u00c3\u00b1and\u00c3\u00ba \u00c3\u2018",
        "\u00c3\u0178 stra\u00c3\u0178e", "\u00e2\u201e\u00a2 tm", "\u00c2\u00a9 2024", "\u00c2\u00b0C and 100\u00b0C", "\u00c3\u2014 times",
        "\u00c3\u00a0 la", "\u00c3\u00a1 fun", "\u00d8\u00a7\u00d9\u201e\u00d8\u00b9\u00d8\u00b1\u00d8\u00a8\u00d9\u0160\u00d8\u00a9 arabic",
        "\u00e0\u00a4\u00b9\u00e0\u00a4\u00bf hindi", "\u00ed\u00a0\u00bd\u00ed\u00b8\u20ac cesu", "\u00c0\u20ac java nul",
        "ma\u00c3\u00b1ana \u00c2\u00a1hola!", "\u00e2\u20ac\u02dcsingle\u00e2\u20ac\u2122", "\u00c5\u00bc\u00c3\u00b3\u00c5\u201a\u00c4\u2021 polish",
        # text that looks odd but is not mojibake
        "\u00a3100 \u20ac5 \u00a55", "na\u00efve caf\u00e9", "100\u00b0C", "\u00d8resund", "\u00d7\u00b2 squared", "\u0152uvre \u0153il",
        "\u00bd cup \u00bc tsp", "\u00c5ngstr\u00f6m", "\u00c9COLE", "\u00a1Hola! \u00bfQu\u00e9?", "\u00a7 5 \u00b6 2", "\u00b1 5 \u00b5m",
        # CJK and other scripts
        "\u4e2d\u6587\u5b57\u7b26", "\u6211\u7231\u5317\u4eac\u5929\u5b89\u95e8", "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3001\u53e5\u8aad\u70b9\u3002",
        "\u6f22\u5b57kanji\u6df7\u5408", "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8", "\uff08\u62ec\u5f27\uff09\u300c\u304b\u304e\u300d", "\u4e00\u4e8c\u4e09",
        "1girl, \u9577\u9aea, \u7b11\u9854", "\U00020000\U00020001 ext-b", "\U00031350 ext-h", "\u3042\u3044\u3046 hiragana",
        "\u30ab\u30bf\u30ab\u30ca", "\uac00\u11a8 jamo", "\u0e44\u0e17\u0e22 thai", "\u0939\u093f\u0928\u094d\u0926\u0940", "\u0627\u0644\u0639\u0631\u0628\u064a\u0629",
        # emoji
        "\U0001f642", "\U0001f44d\U0001f3fd", "\U0001f1ef\U0001f1f5\U0001f1fa\U0001f1f8", "\u2764\ufe0f", "1\ufe0f\u20e3",
        "\U0001f468\u200d\U0001f469\u200d\U0001f467", "\U0001f3f3\ufe0f\u200d\U0001f308", "\u2728sparkles\u2728", "\U0001fae8 shaking",
        "\U0001f3f4\U000e0067\U000e0062\U000e0073\U000e0063\U000e0074\U000e007f scotland", "\u263a\ufe0e text style",
        "(\u256f\u00b0\u25a1\u00b0\uff09\u256f\ufe35 \u253b\u2501\u253b", "\u00af\\_(\u30c4)_/\u00af", "\u0ca0_\u0ca0", "(\uff61\u25d5\u203f\u25d5\uff61)",
        "\u0295\u2022\u1d25\u2022\u0294", "\u250c( \u0ca0_\u0ca0)\u2518", "\u2500\u2500\u2550\u2550 box \u2551\u2554",
        # format characters
        "zero\u200bwidth", "zw\u200cnj and zw\u200dj", "bom\ufeffhere", "\ufeffleading bom", "soft\u00adhyphen", "rtl\u200fmark\u200e",
        "\u202eoverride\u202c", "word\u2060joiner", "\u2061\u2062\u2063\u2064 invisible", "\u206a\u206b\u206f deprecated",
        "\ufff9annot\ufffa\ufffb", "\U000e0001tag", "variation\ufe0fselector", "mongolian\u180evs", "arabic\u0600mark", "\u00ad", "\u200b",
        # control characters and line breaks
        "nul\x00char", "bell\x07 ring", "esc\x1b[0mcolor\x1b[31mred\x1b[0m", "\x1b[1;31mbold\x1b[m", "\x1b]0;title\x07",
        "\x1b[\u0663m arabic digit", "tab\tnew\nline\r\ncr\rend", "\x0bvt\x0cff", "\x1c\x1d\x1e\x1fsep", "del\x7f", "\x85nel",
        "line\u2028sep\u2029para", "\x01\x02\x03\x04\x05\x06\x08", "\x0e\x0f\x10\x1a", "  \t  spaced   out  \n ", "\u00a0nbsp\u00a0\u2009thin\u2002en",
        "\u3000ideo\u3000space", "\u1680ogham", "\u180e\u2060",
        # casing and normalization
        "\u039f\u0394\u039f\u03a3 \u039f\u0394\u039f\u03a3.", "\u0130stanbul", "STRASSE \u1e9e", "cafe\u0301", "\u212b ring", "\u212a kelvin",
        "\u01c5 title", "\u1e9b\u0323", "\u0345 ypogegrammeni", "A\u0308\u0301", "\u1100\u1161\u11a8",
        # special tokens among fixes
        "<|endoftext|> &amp; <|startoftext|>", "a ! b", "a \uff01 b", "&lt;|endoftext|&gt; x", "\u201c<|endoftext|>\u201d",
        "<|endoftext|>\u00c3\u00a9", "!\u2019!",
    ]
    # long captions
    s.append(", ".join(["\u201cmasterpiece\u201d", "best&nbsp;quality", "caf\u00c3\u00a9", "\uff21\uff22\uff23", "\ufb01ne"] * 12))
    s.append("a " * 160)
    s.append(" ".join(["\u4e2d\u6587"] * 50))
    s.append("\n".join(f"line {i} &amp; \u201c{i}\u201d" + (" <br>" if i == 20 else "") for i in range(30)))
    s.append("\u00c3\u00a9" * 100)
    s.append("&amp;" * 100)
    s.append("\u00e2\u20ac\u2122 " * 50)
    # random mixtures of what mojibake is made of
    rnd = random.Random(32)
    pool = (list("aeoxAEZ019 ,.!?'\"-_()[]<>&;#\t\n") +
            ["\u00c3", "\u00c2", "\u00e2", "\u20ac", "\u2122", "\u0153", "\u00a2", "\u00a9", "\u00ae", "\u00b0", "\u00b1",
             "\u00b2", "\u00b3", "\u00b5", "\u00b6", "\u00b7", "\u00b9", "\u00ba", "\u00bb", "\u00bc", "\u00bd", "\u00be",
             "\u00bf", "\u00e9", "\u00f1", "\u00fc", "\u00df", "\u00d0", "\u00d1", "\u00d8", "\u00d9", "\u2500", "\u2502",
             "\u250c", "\u2591", "\x80", "\x81", "\x8d", "\x93", "\x9d", "\u00a0", "\u00ad", "\u201c", "\u201d", "\u2018",
             "\u2019", "\u2026", "\u2013", "\u2014", "\u0160", "\u0161", "\u017d", "\u0178", "\u0192", "\u02c6", "\u02dc",
             "\u0420", "\u0421", "\u0432", "\u0402", "\u039e", "\u03bf", "\u221a", "\u2248", "\u201a", "\u00c4", "\u0101",
             "\u4e2d", "\U0001f642", "\ufb01", "\uff21", "\u3000", "\ufffd", "\u200b", "\ufeff", "\x1b[",
             "&amp;", "&#x41;", "&eacute;", "&lt;", "&#8217;", "&AMP;", "&nbsp;"])
    for _ in range(100):
        s.append("".join(rnd.choice(pool) for _ in range(rnd.randint(1, 24))))
    # mojibake of random accented words, made as the mistake is made
    words = ["caf\u00e9", "na\u00efve", "\u00fcber", "se\u00f1or", "stra\u00dfe", "\u00e9t\u00e9", "co\u00f6perate", "\u2018quote\u2019",
             "\u201cdq\u201d", "em\u2014dash", "\u2026", "\u20ac5", "\u4e2d\u6587", "\U0001f642", "\u041f\u0440\u0438", "\u03b1\u03b2",
             "\u00e0 la", "\u00a0nbsp", "\u2122", "\u00bd"]
    for _ in range(60):
        w = " ".join(rnd.choice(words) for _ in range(rnd.randint(1, 4)))
        enc = rnd.choice(["latin-1", "cp1252", "cp1252", "cp1251", "cp1250", "cp1253", "mac_roman", "cp437"])
        try:
            bad = w.encode("utf-8").decode(enc)
        except UnicodeDecodeError:
            bad = w.encode("utf-8").decode("latin-1")
        s.append(bad if rnd.random() < 0.7 else w + " " + bad)
    return s


def ftfy_cases(a):
    import ftfy
    import regex
    tl, tg = load(os.path.join(OUT, "clip_l"), ftfy=True), load(os.path.join(OUT, "clip_g"), ftfy=True)
    nl, ng = load(os.path.join(OUT, "clip_l")), load(os.path.join(OUT, "clip_g"))
    from transformers.models.clip.tokenization_clip import whitespace_clean
    hard = hard_captions()
    # the default mode's strings, but for its long captions (plain words: cases.json has them)
    old = [c["text"] for c in json.load(open(os.path.join(OUT, "cases.json"), encoding="utf-8"))["cases"]
           if len(c["ids_l"]) <= 80]
    cases, differ = [], 0
    for text in hard + old:
        c = {"text": text, "clean": whitespace_clean(ftfy.fix_text(text)).lower(),
             "ids_l": tl(text, add_special_tokens=False).input_ids,
             "ids_g": tg(text, add_special_tokens=False).input_ids}
        if text in hard:
            c["hard"] = True
            c["none_l"] = nl(text, add_special_tokens=False).input_ids
            c["none_g"] = ng(text, add_special_tokens=False).input_ids
            differ += c["none_l"] != c["ids_l"] or c["none_g"] != c["ids_g"]
            if c["none_g"] == c["none_l"]:
                del c["none_g"]  # clip_g's ids are clip_l's unless a lone "!" (its pad) appears
        if c["ids_g"] == c["ids_l"]:
            del c["ids_g"]
        cases.append(c)
    with open(os.path.join(OUT, "ftfy_cases.json"), "w", encoding="utf-8") as f:
        json.dump({"cases": cases}, f, ensure_ascii=False, separators=(",", ":"))
    set_version("ftfy_cases.json: ", f"python {sys.version.split()[0]}, transformers {transformers.__version__} (slow "
                f"CLIPTokenizer), ftfy {ftfy.__version__}, regex {regex.__version__}")
    print(f"{len(cases)} cases ({len(hard)} hard captions, {differ} of them tokenized differently with ftfy)")
    if a.full_bpe and a.full_out:
        lines = gzip.open(a.full_bpe).read().decode("utf-8").split("\n")
        merges = [tuple(m.split()) for m in lines[1:49152 - 256 - 2 + 1]]
        d = a.full_out + ".d"
        write_folder(d, clip_vocab(merges), merges, "<|endoftext|>", "special_tokens_map")
        ff, fn = load(d, ftfy=True), load(d)
        out = {"texts": hard, "ftfy": [ff(t, add_special_tokens=False).input_ids for t in hard],
               "none": [fn(t, add_special_tokens=False).input_ids for t in hard]}
        with open(a.full_out, "w") as f:
            json.dump(out, f, ensure_ascii=True)
        n = sum(x != y for x, y in zip(out["ftfy"], out["none"]))
        print(f"full vocabulary: {n} of {len(hard)} hard captions differ with ftfy; ids in {a.full_out}")


def ftfy_tables():
    import ftfy
    from ftfy import badness, chardata
    import re as std_re
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "vm", "text", "ftfy_tables.h")
    L = []
    L.append(f"/* Generated by tests/ref/make_tokenizer_ref.py --ftfy-tables from ftfy {ftfy.__version__}")
    L.append(" * (Apache-2.0; its character classes, ligatures and HTML entity names) and")
    L.append(f" * Python {sys.version.split()[0]}'s codecs (the single-byte encodings): the data of")
    L.append(" * vm/text/ftfy.c. Do not edit. */")
    L.append("#ifndef CK_FTFY_TABLES_H\n#define CK_FTFY_TABLES_H\n\n#include <stdint.h>\n")
    # the classes: badness's categories, then the UTF-8 clues, one bit each
    classes = list(badness.MOJIBAKE_CATEGORIES.items()) + list(chardata.UTF8_CLUES.items())
    names = [k.upper() for k, _ in classes]
    for i, n in enumerate(names):
        L.append(f"#define FT_{n} (1u << {i})")
    masks = {}
    for i, (k, v) in enumerate(classes):
        rx = std_re.compile("[" + v + "]")
        for cp in range(0x10000):
            if rx.match(chr(cp)):
                masks[cp] = masks.get(cp, 0) | (1 << i)
    L.append("\n/* the classes of each character in one (sorted by code point) */")
    L.append("static const struct ft_class { uint16_t cp; uint32_t mask; } FT_CLASSES[] = {")
    row = []
    for cp in sorted(masks):
        row.append(f"{{0x{cp:04X}, 0x{masks[cp]:05X}}}")
        if len(row) == 6:
            L.append("    " + ", ".join(row) + ",")
            row = []
    if row:
        L.append("    " + ", ".join(row) + ",")
    L.append("};\n")
    # the encodings ftfy tries, in its order: what bytes 0x80..0xFF and 0x1A decode to
    encs = chardata.CHARMAP_ENCODINGS
    L.append(f"#define FT_NENC {len(encs)}")
    L.append("/* " + ", ".join(encs) + " */")
    L.append("static const char *const FT_ENC_NAME[FT_NENC] = {" + ", ".join(f'"{e}"' for e in encs) + "};")
    L.append("static const uint8_t FT_ENC_SLOPPY[FT_NENC] = {" + ", ".join("1" if e.startswith("sloppy") else "0" for e in encs) + "};")
    L.append("/* what byte 0x1A decodes to (U+FFFD in the sloppy ones) */")
    L.append("static const uint16_t FT_ENC_1A[FT_NENC] = {" +
             ", ".join(f"0x{ord(bytes([0x1A]).decode(e)):04X}" for e in encs) + "};")
    L.append("/* what bytes 0x80 .. 0xFF decode to */")
    L.append("static const uint16_t FT_ENC_HIGH[FT_NENC][128] = {")
    for e in encs:
        chars = bytes(range(0x80, 0x100)).decode(e)
        L.append(f"    /* {e} */ {{")
        for r in range(0, 128, 12):
            L.append("        " + ", ".join(f"0x{ord(ch):04X}" for ch in chars[r:r + 12]) + ",")
        L.append("    },")
    L.append("};\n")
    L.append("/* ligatures taken apart (fix_latin_ligatures) */")
    L.append("static const struct ft_lig { uint16_t cp; uint16_t to[3]; } FT_LIGATURES[] = {")
    for cp in sorted(chardata.LIGATURES):
        to = chardata.LIGATURES[cp]
        L.append(f"    {{0x{cp:04X}, {{" + ", ".join(f"0x{ord(ch):04X}" for ch in to) + "}},")
    L.append("};\n")
    ents = sorted((k[1:-1], v) for k, v in chardata.HTML_ENTITIES.items())
    assert all(k.isascii() for k, _ in ents) and max(len(v) for _, v in ents) <= 3
    L.append("/* HTML entities by name (between & and ;, sorted as strcmp sorts): what they stand for */")
    L.append("static const struct ft_entity { const char *name; uint32_t cp[3]; } FT_ENTITIES[] = {")
    for k, v in ents:
        L.append(f'    {{"{k}", {{' + ", ".join(f"0x{ord(ch):X}" for ch in v) + "}},")
    L.append("};\n")
    L.append("#endif")
    with open(out, "w") as f:
        f.write("\n".join(L) + "\n")
    set_version("../../../vm/text/ftfy_tables.h: ", f"ftfy {ftfy.__version__}, python {sys.version.split()[0]}")
    print(f"{out}: {len(masks)} classed characters, {len(encs)} encodings, {len(ents)} entities")


def tf5_folders():
    assert int(transformers.__version__.split(".")[0]) >= 5, "run with transformers 5"
    import tokenizers
    for name in ("clip_l", "clip_g"):
        d = os.path.join(OUT, name + "_tf5")
        tok = CLIPTokenizer.from_pretrained(os.path.join(OUT, name))
        tok.save_pretrained(d)
        assert sorted(os.listdir(d)) == ["tokenizer.json", "tokenizer_config.json"], os.listdir(d)
        with open(os.path.join(d, "tokenizer.json"), encoding="utf-8") as f:
            j = json.load(f)
        with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(j, f, ensure_ascii=False, separators=(",", ":"))
    set_version("clip_l_tf5/, clip_g_tf5/: ", f"transformers {transformers.__version__}, tokenizers "
                f"{tokenizers.__version__} (CLIPTokenizer.from_pretrained(clip_x).save_pretrained; tokenizer.json "
                "re-written without indentation)")
    print("clip_l_tf5/, clip_g_tf5/ written")


def fuzz_corpus():
    """tests/fuzz/corpus/tokenizer: fuzz_tokenizer's seeds. Byte 0 picks the
    reader (0 gzip, 1 vocab.json NUL merges.txt, 2 tokenizer.json, 3 a bpe
    merges text, 4 a caption), byte 1 the guard (0x80 | k: refuse past 4k KiB,
    0x40 | k: stop at poll k, else none), the rest is the file."""
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fuzz", "corpus", "tokenizer")
    os.makedirs(out, exist_ok=True)
    for f in glob.glob(os.path.join(out, "*")):
        os.remove(f)
    vocab_all = json.load(open(os.path.join(OUT, "clip_l", "vocab.json"), encoding="utf-8"))
    merges_all = open(os.path.join(OUT, "clip_l", "merges.txt"), encoding="utf-8").read().split("\n")[1:]
    merges = [m for m in merges_all[:60] if m]
    keep = [k for k in vocab_all if len(k) == 1][:96] + ["".join(m.split()) for m in merges]
    vocab = {k: i for i, k in enumerate(dict.fromkeys(keep))}
    vocab["<|startoftext|>"], vocab["<|endoftext|>"] = len(vocab), len(vocab) + 1
    vj = json.dumps(vocab, ensure_ascii=False, separators=(",", ":")).encode()
    big = dict(vocab, **{f"t{i}": len(vocab) + i for i in range(8000)})
    big_vocab = json.dumps(big, separators=(",", ":")).encode()
    mt = ("#version: 0.2\n" + "\n".join(merges) + "\n").encode()
    tj = lambda merges_form, extra="": json.dumps(json.loads(
        '{"added_tokens": [{"id": %d, "content": "<|endoftext|>", "special": true}]%s, "model": {"type": "BPE", '
        '"end_of_word_suffix": "</w>", "continuing_subword_prefix": "", "vocab": %s, "merges": %s}}'
        % (vocab["<|endoftext|>"], extra, vj.decode(), json.dumps(merges_form))), ensure_ascii=False).encode()

    def gz(b, mtime=0):
        import io
        buf = io.BytesIO()
        with gzip.GzipFile(fileobj=buf, mode="wb", mtime=mtime) as f:
            f.write(b)
        return buf.getvalue()

    seeds = {
        "gz_merges": (0, 0, gz(mt)),
        "gz_two_members": (0, 0, gz(mt[:40]) + gz(mt[40:])),
        "gz_zero_padded": (0, 0, gz(mt) + b"\0" * 16),
        "gz_bomb_true_size": (0, 0, gz(b"\0" * (2 << 20))),
        "gz_bomb_lying": (0, 0, gz(b"\0" * (2 << 20))[:-4] + b"\x10\0\0\0"),
        "gz_cut": (0, 0, gz(mt)[:30]),
        "gz_not_gzip": (0, 0, mt),
        "gz_limit": (0, 0x81, gz(mt * 40)),
        "gz_stop": (0, 0x41, gz(b"a b\n" * (1 << 17))),
        "vocab_merges": (1, 0, vj + b"\0" + mt),
        "vocab_limit": (1, 0x81, vj + b"\0" + mt),
        # past 64 KiB of JSON and 4096 entries, where the readers poll (longer than
        # the fuzzer's inputs: for the replay)
        "vocab_stop": (1, 0x41, big_vocab + b"\0" + mt),
        "vocab_stop_table": (1, 0x42, big_vocab + b"\0" + mt),
        "vocab_duplicate": (1, 0, b'{"a": 0, "a": 1}\0#v\n'),
        "vocab_negative": (1, 0, b'{"a": -1}\0#v\n'),
        "vocab_not_json": (1, 0, b'{"a": 0,\0#v\n'),
        "vocab_no_specials": (1, 0, b'{"a": 0}\0#v\na b\n'),
        "vocab_nested": (1, 0, b"[" * 3000 + b"\0#v\n"),
        "vocab_merges_three": (1, 0, vj + b"\0#v\na b c\n"),
        "vocab_merges_long": (1, 0, vj + b"\0#v\n" + b"a" * 1100 + b" b\n"),
        "tokenizer_json_pairs": (2, 0, tj([m.split() for m in merges])),
        "tokenizer_json_strings": (2, 0, tj(merges)),
        "tokenizer_json_added": (2, 0, tj(merges, ', "x": 1').replace(b'"special": true}]', b'"special": true}, {"id": 9999, "content": "<|pad|>"}]')),
        "tokenizer_json_conflict": (2, 0, tj(merges).replace(b'"id": %d' % vocab["<|endoftext|>"], b'"id": 3')),
        "tokenizer_json_unigram": (2, 0, b'{"model": {"type": "Unigram", "vocab": [["a", 0.0]]}}'),
        "tokenizer_json_wordpiece": (2, 0, b'{"model": {"type": "BPE", "end_of_word_suffix": "", "continuing_subword_prefix": "##", "vocab": {}, "merges": []}}'),
        "tokenizer_json_bad_merge": (2, 0, tj(["a"])),
        "tokenizer_json_stop": (2, 0x42, b'{"model": {"type": "BPE", "end_of_word_suffix": "</w>", "merges": [], "vocab": '
                                + big_vocab + b"}}"),
        "bpe_text": (3, 0, mt),
        "bpe_header_only": (3, 0, b"#version: 0.2\n"),
        "bpe_bad_line": (3, 0, b"#v\na b c\n"),
    }
    for i, text in enumerate(hard_captions()[:120:3]):
        seeds[f"caption_{i:02d}"] = (4, 0, text.encode("utf-8"))
    for name, (mode, how, body) in seeds.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(bytes([mode, how]) + body)
    print(f"{len(seeds)} seeds in {out}")


def main():
    ap = argparse.ArgumentParser()
    found = glob.glob("/work/venv-ref/lib/python3*/site-packages/open_clip/bpe_simple_vocab_16e6.txt.gz")
    ap.add_argument("--bpe", default=found[0] if found else None)
    ap.add_argument("--full-out", default=None)
    ap.add_argument("--full-bpe", default=None)
    ap.add_argument("--ftfy", action="store_true")
    ap.add_argument("--ftfy-tables", action="store_true")
    ap.add_argument("--tf5", action="store_true")
    ap.add_argument("--fuzz-corpus", action="store_true")
    a = ap.parse_args()
    if a.fuzz_corpus:
        return fuzz_corpus()
    if a.ftfy:
        return ftfy_cases(a)
    if a.ftfy_tables:
        return ftfy_tables()
    if a.tf5:
        return tf5_folders()
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
    set_version("cases.json, clip_l/, clip_g/, bpe_small.txt.gz: ",
                f"python {sys.version.split()[0]}, transformers {transformers.__version__} (slow CLIPTokenizer, "
                f"ftfy not installed); bpe: first {SMALL_MERGES} merges of open_clip's bpe_simple_vocab_16e6.txt.gz")
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
