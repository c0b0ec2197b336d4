"""Texts that tokenizers disagree on: prose in several scripts, code, whitespace runs, long numbers, emoji (ZWJ
sequences, flags, skin tones), and a tokenizer's own special tokens written in the text.

`corpus(specials)` is the quick set (make test); `full_corpus(specials)` adds the repository's own docs and
Python files cut into chunks (prose and code as people write them) for the table in docs/tokenizers.md.
"""
from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

PROSE = [
    "The quick brown fox jumps over the lazy dog.",
    "Ünïcödé äccents: café naïve résumé Ångström façade coöperate Øresund Łódź Šibenik",
    "L'été dernier, nous avons visité la Côte d'Azur ; c'était magnifique !",
    "Größere Straßen führen über die Brücke. ẞ ß ſ",
    "Русский текст: Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "Ελληνικά: Ξεσκεπάζω την ψυχοφθόρα βδελυγμία. Καλημέρα κόσμε!",
    "日本語のテキスト：吾輩は猫である。名前はまだ無い。カタカナとひらがな",
    "中文文本：我能吞下玻璃而不伤身体。繁體中文：臺灣",
    "한국어 텍스트: 다람쥐 헌 쳇바퀴에 타고파",
    "مرحبا بالعالم. هذه جملة عربية مع أرقام ١٢٣٤٥٦٧٨٩٠",
    "हिन्दी पाठ: ऋषियों को सताने वाले दुष्ट राक्षसों के राजा रावण का सर्वनाश करने वाले विष्णुवतार भगवान श्रीराम",
    "עברית: דג סקרן שט בים מאוכזב ולפתע מצא חברה",
    "ไทย: เป็นมนุษย์สุดประเสริฐเลิศคุณค่า",
    "Tiếng Việt: Tôi có thể ăn thủy tinh mà không hại gì.",
    "Türkçe: Pijamalı hasta yağız şoföre çabucak güvendi. İstanbul ılık",
    "Mixed: The word 'naïve' is written наивный in Russian and 天真 in Chinese.",
    "ALLCAPS lowercase MiXeD CamelCaseWord snake_case_word kebab-case-word HTTPServerError iPhone",
    "don't can't won't it's I'm we've they're he'd I'll DON'T IT'S Y'all O'Neil",
    "A , b . c ' s don 't ,,, ... !!! ??? ;;; :::",
    "Mathematical: ∀x∈ℝ, x² ≥ 0; ∑_{i=1}^{n} i = n(n+1)/2; ∫₀^∞ e^{-x} dx = 1; α≠β",
    "ſtraße ﬁ ﬀ Ⅻ ① ㍿ ｆｕｌｌｗｉｄｔｈ ＡＢＣ１２３ ½ ™ © ®",
    "e\u0301 (e + combining acute) vs é; n\u0303 vs ñ; Å vs A\u030a",
    "\u00a0non-breaking\u00a0space, zero\u200bwidth, soft\u00adhyphen, \u200eLTR mark, \ufeffBOM",
    "Control chars: \x07 bell \x1b[31m red \x1b[0m \x00 nul \x7f del",
]
CODE = [
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    'for (int i = 0; i < 10; ++i) { printf("%d\\n", i); }',
    "import numpy as np\nx = np.arange(12).reshape(3, 4)  # comment\n\n\nclass Foo(Bar):\n\tpass\n",
    "```python\nprint('hi')\n```\n",
    'JSON: {"key": [1, 2, 3], "nested": {"a": null, "b": true, "c": "d\\u00e9"}}',
    "<html>\n  <body class=\"main\">\n    <p>Hello &amp; welcome</p>\n  </body>\n</html>",
    "SELECT id, name FROM users WHERE age >= 21 AND name LIKE '%son' ORDER BY id DESC;",
    "fn main() -> Result<(), Box<dyn Error>> {\n    let v: Vec<u8> = vec![0; 1024];\n    Ok(())\n}\n",
    "#!/bin/bash\nset -euo pipefail\nfor f in *.txt; do echo \"$f\" | tr a-z A-Z; done",
    "https://example.com/path/to/page?query=1&b=2#frag user@example.com (555) 123-4567",
    "C:\\Users\\name\\Documents\\file.txt /usr/local/bin/python3.11 ../../etc/passwd",
    "x = a||b && c!=d; y <<= 2; z = ~w ^ 0xFF; s = `tpl ${v}`; r = /^\\s+$/g",
]
WHITESPACE = [
    " ", "  ", "     ", "\t", "\t\t\t", "\n", "\n\n\n", "\r\n", " \n \n ", "\t \t \n\t",
    "  leading and trailing spaces   ",
    "\n\nnewlines\n\n\nand more\n",
    "tabs\tand\t\tmixed \t whitespace\r\n",
    "word    word\t\tword\n\n\nword \n\t word",
    "    indented\n        more\n\t\ttabbed\n",
    "trailing space \ntrailing tab\t\ntrailing both \t\n",
    "\r\nWindows line endings\r\n\r\n",
    "x  1 and  22 and   333 and \t4444",
    "",
]
DIGITS = [
    "12345 678.90 3.14159 1e-10 0x1F 1,000,000 -42 +7",
    "3141592653589793238462643383279502884197169399375105820974944592307816406286",
    "Year 2024, 1999-12-31T23:59:59Z, 10:30 pm, v1.2.34, 192.168.0.1:8080",
    "Prices: $19.99, €5, ¥1000, £3.50, ₹1,23,456.78, 100%",
    "٠١٢٣٤٥٦٧٨٩ ०१२३४५६७८९ 一二三 ①②③ ¹²³ ⁴⁵⁶",
    "a1b22c333d4444e55555 x1y2z3 0007 00000000",
]
EMOJI = [
    "Emoji: 😀🎉👍🏽 ❤️ ✨ 🚀",
    "ZWJ family: 👨\u200d👩\u200d👧\u200d👦 and 👩🏽\u200d💻 and 🏳️\u200d🌈 and 🧑\u200d🤝\u200d🧑",
    "Flags: 🇫🇷🇯🇵🇺🇸 🏴\U000e0067\U000e0062\U000e0073\U000e0063\U000e0074\U000e007f",
    "Keycaps 1️⃣ #️⃣ and variation selectors ☺︎ ☺️ and 🤗🤗🤗",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕄𝕒𝕥𝕙 𓀀 𐍈 \U0010fffd",
]


def _with_specials(specials: list[str]) -> list[str]:
    """The tokenizer's specials in text: alone, glued to words, between spaces and newlines, and cut short."""
    if not specials:
        return []
    a, b = specials[0], specials[-1]
    mid = specials[len(specials) // 2]
    return [
        a, "".join(specials),
        f"{a}Hello{b}", f" {a} spaced {mid} words {b} ", f"\n{a}\nline\n{b}\n", f"text{mid}text{mid}",
        f"{a}  {b}\t{mid}", f"{a[:-1]} {b[1:]} {mid[:len(mid) // 2]}",
        f"{a}user\nWhat is 2+2?{b}\n{mid}assistant\n4{b}",
    ]


def corpus(specials: list[str]) -> list[str]:
    """The quick corpus (make test): every group above, and the tokenizer's specials in text."""
    return PROSE + CODE + WHITESPACE + DIGITS + EMOJI + _with_specials(specials)


def full_corpus(specials: list[str], chunk: int = 2000) -> list[str]:
    """The quick corpus plus the repository's README, docs/*.md and Python files in chunks of `chunk` characters."""
    files = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")),
             *sorted(p for d in ("pipeline", "runtime", "service") for p in (REPO / d).glob("*.py"))]
    texts = corpus(specials)
    for path in files:
        text = path.read_text(encoding="utf-8")
        texts += [text[i:i + chunk] for i in range(0, len(text), chunk)]
    return texts
