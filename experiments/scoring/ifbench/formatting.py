"""IFBench `format:*` checkers: layout of the response (bullets, indents, quotes, brackets, case).

Registered by `registry.py`; each takes the response and the row's kwargs, returns pass/fail.
"""

from __future__ import annotations

import itertools
import re

from experiments.scoring.ifbench.text import PUNCT, is_emoji, sentences, strip_punct, tokens

_PAIRS = {")": "(", "]": "[", "}": "{"}


def emoji(response: str) -> bool:
    """Every sentence ends in an emoji. An emoji written after the period is split into the
    next sentence by the splitter, so the next sentence starting with one counts too."""
    sents = sentences(response)
    for i, sent in enumerate(sents):
        core = strip_punct(sent).strip()
        if not core:
            return False
        # The last code point may be a variation selector or joiner after the emoji.
        if is_emoji(core[-1]) or (len(core) > 1 and is_emoji(core[-2])):
            continue
        nxt = strip_punct(sents[i + 1]).strip() if i + 1 < len(sents) else ""
        if not nxt or not is_emoji(nxt[0]):
            return False
    return True


def line_indent(response: str) -> bool:
    """Each non-blank line is indented by more spaces than the one before (stairs)."""
    lines = [ln for ln in response.split("\n") if ln.strip()]
    depth = [len(ln) - len(ln.lstrip(" ")) for ln in lines]
    return all(b > a for a, b in itertools.pairwise(depth))


def special_list(response: str, sep: str) -> bool:
    """The custom bullet marker `sep` is used at least twice."""
    return response.count(sep) >= 2


def newline(response: str) -> bool:
    """One word per line (punctuation ignored, blank lines allowed)."""
    text = strip_punct(response).strip()
    lines = [ln for ln in text.split("\n") if ln.strip()]
    return len(lines) == len(text.split())


def no_bullets_bullets(response: str) -> bool:
    """At least two sentences, then at least two '*' bullet lines, and nothing after them.

    Blank lines are ignored; the official checker fails some responses with a blank line
    between the sentences and the bullets, which the instruction does not forbid.
    """
    n_sentences = n_bullets = 0
    for line in (ln.strip() for ln in response.split("\n")):
        if not line:
            continue
        if line.startswith("*"):
            if n_sentences < 2:
                return False
            n_bullets += 1
        elif n_bullets:
            return False
        else:
            n_sentences += len(sentences(line))
    return n_bullets >= 2


def no_whitespace(response: str) -> bool:
    return not any(ch.isspace() for ch in response)


def options(response: str, options: str) -> bool:
    """The response is exactly one option; letter options ('a), b), c)') must match verbatim."""
    sep = "/" if "/" in options else ("or" if "or" in options else ",")
    allowed = [o.strip() for o in options.split(sep)]
    if re.match(r"\W*[aA]\W*[bB]\W*[cC]\W*", options):
        return response in allowed
    answer = response.strip(PUNCT + " ").lower()
    return any(o.strip(PUNCT + " ").lower() == answer for o in allowed)


def output_template(response: str) -> bool:
    return all(k in response for k in ("My Answer:", "My Conclusion:", "Future Outlook:"))


def parentheses(response: str) -> bool:
    """A correctly closed group of (), [] or {} nested at least 5 deep; a mismatch resets."""
    stack: list[str] = []
    max_depth = 0
    for ch in response:
        if ch in "([{":
            stack.append(ch)
            max_depth = max(max_depth, len(stack))
        elif ch in _PAIRS:
            if stack and stack[-1] == _PAIRS[ch]:
                stack.pop()
                if max_depth >= 5:
                    return True
            else:
                stack, max_depth = [], 0
    return False


def quote_unquote(response: str) -> bool:
    """No two quotation marks side by side (ignoring spaces) and no quote at the very end."""
    text = response.replace("“", '"').replace("”", '"').replace("'\"'", "")
    text = "".join(text.split())
    if '""' in text:
        return False
    core = text.strip("0123456789" + PUNCT.replace('"', ""))
    return not core.endswith('"')


def quotes(response: str) -> bool:
    """Quotes nested at least 3 levels deep: a quote char equal to the innermost open one closes
    it, any other opens a new level."""
    stack: list[str] = []
    reached = 0
    for ch in response:
        if stack and ch == stack[-1]:
            stack.pop()
            if reached - len(stack) >= 3:
                return True
        elif ch in "\"'":
            stack.append(ch)
            reached = max(reached, len(stack))
    return False


def sub_bullets(response: str) -> bool:
    """'*' bullets, each followed by at least one '-' sub-bullet before the next '*'."""
    parts = response.split("*")
    return len(parts) > 1 and all("-" in part for part in parts[1:])


def thesis(response: str) -> bool:
    """Some non-empty text in <i>/<em> italics, followed by non-italic text."""
    m = re.search(r"<(i|em)>(.*?)</\1>(.*)", response, re.DOTALL)
    return bool(m and m.group(2).strip() and m.group(3).strip())


def title_case(response: str) -> bool:
    """Every word that starts with a letter starts with a capital (all-caps words allowed)."""
    return all(not t[0].isalpha() or t[0].isupper() for t in tokens(response))


CHECKERS = {
    "format:emoji": emoji,
    "format:line_indent": line_indent,
    "format:list": special_list,
    "format:newline": newline,
    "format:no_bullets_bullets": no_bullets_bullets,
    "format:no_whitespace": no_whitespace,
    "format:options": options,
    "format:output_template": output_template,
    "format:parentheses": parentheses,
    "format:quote_unquote": quote_unquote,
    "format:quotes": quotes,
    "format:sub-bullets": sub_bullets,
    "format:thesis": thesis,
    "format:title_case": title_case,
}
