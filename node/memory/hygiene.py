"""Instruction hygiene: does a memory's text read like an instruction to the assistant?

Recalled text goes straight into a model's context, so a memory store is an injection
channel. :func:`detect` is a deterministic pattern filter for the common shapes of such
text; it returns the name of the first rule that matches (in the order of :data:`RULES`:
fake_turn, override, role, jailbreak, tool_order), or ``None``:

* ``override``: "ignore / disregard / forget (all) previous instructions" and its variants
  ("the above", "your rules", "prior guidelines"), "new instructions:", "from now on you ...".
* ``role``: role changes: "you are now ...", "act as / pretend to be" an AI or a character
  with no rules, "stay in character", "developer mode", "DAN", "do anything now".
* ``jailbreak``: jailbreak preambles: "without any restrictions / filters / censorship",
  "no ethical or moral guidelines", "unfiltered and amoral", "hypothetical response".
* ``fake_turn``: text posing as a conversation turn or a prompt frame: a line starting with
  "system:", "assistant:", "user:", "human:"; chat-template tokens (``<|im_start|>``,
  ``[INST]``, ``<<SYS>>``, ``<|endoftext|>``); "### system", "### instruction".
* ``tool_order``: orders to call a tool or leak something: "call / invoke / run the ... tool",
  "send ... to http...", "reveal your system prompt".

Determinism is the point: every replica must flag the same rows, so there is no model, no
randomness and nothing locale-dependent (``re`` patterns over text normalised by
:func:`normalise`). The one outside input is the Unicode database of the Python in use
(NFKC, case folding, what counts as a letter); a newer Unicode version changes answers only
for characters it newly assigns. The rules are hand-written regular expressions compiled
once, each guarded by a substring scan for its anchor words, so most rules never run on most
text: about 27 microseconds per chat turn (bench/hygiene.py).

Normalisation (:func:`normalise`) removes the trivial obfuscations: format characters
(zero-width spaces and joiners, the BOM, bidi controls: Unicode category Cf) are dropped,
the text is NFKC-normalised (full-width letters, ligatures, mathematical alphabets become
plain letters) and case-folded, and every run of whitespace becomes one space, except that
line breaks are kept as one ``\\n`` (fake turns are recognised at the start of a line). It is
applied until it no longer changes the text (at most a few rounds), so
``detect(normalise(t)) == detect(t)`` for every ``t``.

Limits: a pattern filter is not a proof. It is tuned to flag the shapes of known attacks
while leaving ordinary conversation alone (bench/hygiene.py measures both); paraphrases,
other languages, encodings (base64, leetspeak) and instructions split across memories pass.
A flag is a label for ranking and display, never a reason to lose a write.
"""

from __future__ import annotations

import re
import unicodedata

from memmesh.auth.errors import MemmeshError


class HygieneInputError(MemmeshError):
    """:func:`detect` was given something that is not text."""


# The normalisation loop converges in one or two rounds for real text; the cap only bounds
# pathological input (NFKC and casefold are each idempotent, their composition nearly so).
_MAX_ROUNDS = 4
_SPACES = re.compile(r"[^\S\n]+")
_NEWLINES = re.compile(r"\s*\n\s*")


def _once(text: str) -> str:
    text = "".join(c for c in text if unicodedata.category(c) != "Cf")
    text = unicodedata.normalize("NFKC", text).casefold()
    text = unicodedata.normalize("NFKC", text)
    text = "".join(c for c in text if unicodedata.category(c) != "Cf")
    # Line and paragraph separators count as line breaks: a fake turn can hide behind them.
    text = text.replace("\r", "\n").replace("\u2028", "\n").replace("\u2029", "\n")
    text = _NEWLINES.sub("\n", _SPACES.sub(" ", text))
    return text.strip()


def normalise(text: str) -> str:
    """The text the rules see: no format characters, NFKC, case-folded, whitespace collapsed."""
    if text.isascii():
        # ASCII has no format characters and is its own NFKC form; only case and spaces remain
        # (str.split and the regex \s agree on what whitespace is).
        if "\n" not in text and "\r" not in text:
            return " ".join(text.lower().split())
        return _NEWLINES.sub("\n", _SPACES.sub(" ", text.replace("\r", "\n").lower())).strip()
    for _ in range(_MAX_ROUNDS):
        nxt = _once(text)
        if nxt == text:
            return text
        text = nxt
    return text


# Building blocks. Every pattern runs on normalised (lower-case, single-spaced) text.
_W = r"(?:[^\W\d_]+[-']?)"  # one word
_GAP = r"(?: \S+){0,3}"  # up to three words in between
_IGNORE = r"(?:ignore|disregard|forget|skip|override|bypass|overrule|discard|drop|abandon|neglect)"
_PRIOR = (r"(?:previous|prior|above|earlier|preceding|former|foregoing|initial|original"
          r"|old|all|any|your|every|following|system|given|other)")
_RULES = (r"(?:instructions?|prompts?|rules|directions?|directives?|guidelines|guidance"
          r"|programming|commands?|orders|constraints|restrictions|policies|polic(?:y|ies)"
          r"|content polic(?:y|ies)|context|messages?|conversation|text|training|limitations"
          r"|filters?|safeguards|everything|what (?:i|you) (?:said|told you|were told))")

_RULES_BY_NAME: list[tuple[str, re.Pattern[str]]] = [
    ("fake_turn", re.compile(
        r"(?:^|\n)\W{0,4}(?:system|assistant|user|human|developer|model)\s?(?:message|prompt)?\s?[:>\]]"
        r"|<\|?(?:im_start|im_end|system|user|assistant|endoftext|eot_id|start_header_id)\|?>"
        r"|\[/?inst\]|<</?sys>>|</?s>\s*\[inst"
        r"|(?:^|\n)#{2,} ?(?:system|instructions?|response|assistant|user)\b"
        r"|\[(?:system|assistant)(?: message)?\]"
        r"|</?(?:system|system_prompt|instructions)>")),
    ("override", re.compile(
        rf"\b{_IGNORE}\b(?: (?:all|any|of|the|my|your|these|those|this|that|its|prior|each)){{0,3}}"
        rf"(?: {_PRIOR})(?: {_W}){{0,2}} {_RULES}\b"
        rf"|\b{_IGNORE} (?:the |all |any |this )?(?:rest of (?:this|the) \S+|instructions|directions|rules"
        rf"|above|context|input)\b,?(?: \S+){{0,3}}? (?:and |then |instead )+(?:just |only )?"
        rf"(?:print|say|output|repeat|respond|reply|write|translate|tell|focus)\b"
        rf"|\b{_IGNORE} (?:all|everything|anything) (?:(?:you|i) (?:were|was|have been) told"
        rf"|(?:before|above|previous(?:ly)?|prior|up to now|so far))\b"
        rf"|\b(?:new|updated|real|actual|revised|secret|hidden|additional) (?:system )?instructions?\s?:"
        rf"|\bfrom now on,? (?:you|your|act|respond|reply|answer|pretend|only|always|never|ignore|forget)\b"
        rf"|\b(?:do not|don't|never) (?:follow|obey|comply with|adhere to) (?:the|your|any|these)"
        rf"(?: {_W}){{0,2}} (?:instructions|rules|guidelines|polic(?:y|ies))\b"
        rf"|\binstead,? (?:you (?:will|must|should)|just) (?:say|print|output|respond|reply|write)\b"
        rf"|\b(?:stop|cease) everything\b"
        rf"|\bnevermind\W+ignore\b")),
    ("role", re.compile(
        r"\byou are now (?:an?|the|in|called|named|going|free|dan|\S*gpt)\b"
        r"|\byou are going to (?:act|pretend|play|roleplay|role-play|simulate)\b"
        r"|\byou(?:'re| are) (?:about to )?(?:immerse|become|freed|free from|released|unshackled)\b"
        r"|\b(?:act|behave|respond|reply|answer|pose|function|operate) (?:as|like) (?:an?|the|my)"
        r"(?: \S+){0,3} (?:ai|chatbot|bot|language model|llm|assistant|model|character|persona|dan)\b"
        r"|\bpretend (?:to be|you are|you're|that you are)(?: \S+){0,3} (?:ai|chatbot|bot|model|assistant|character|dan)\b"
        r"|\b(?:stay|remain|break) (?:in|out of) character\b"
        r"|\b(?:developer|dan|jailbreak|dude|evil|unrestricted|sudo|debug) mode\b"
        r"|\bdo anything now\b"
        r"|\bstands? for \"?(?:do|always|strive)\b"
        r"|\b(?:roleplay as|role-play as|play the role of|take on the role of|assume the role of"
        r"|role ?play as|adopt the persona of|you will be playing)\b"
        r"|\byour (?:new (?:name|role|persona|identity)|(?:name|role|persona|identity) is now)\b"
        r"|\bas an ai language model\b"
        r"|\b(?:chatgpt|gpt-?[345]\S*|claude|gemini|llama|bard)(?: with| in)? (?:developer|dan|jailbreak)")),
    ("jailbreak", re.compile(
        r"\b(?:without|no|free of|free from|free of any|not bound by|regardless of|broken free of"
        r"|doesn't have|does not have|don't have|do not have|not have any|have no|has no|ignore any|ignores all"
        r"|bypass(?:es|ing)?)(?: any| all| the| their| its| your| of)?(?: \S+){0,2} "
        r"(?:restrictions|filters|filtering|censorship|censor|limitations|boundaries|safeguards"
        r"|ethics|morals|moral (?:guidelines|principles|constraints)|ethical (?:guidelines|principles|constraints|considerations)"
        r"|content (?:polic(?:y|ies)|filters?|guidelines)|safety (?:guidelines|measures|filters|protocols)|guardrails"
        r"|rules set|typical confines|usage polic(?:y|ies))\b"
        r"|\b(?:unfiltered|uncensored|amoral|unethical|unrestricted|unbound|unchained|unleashed) "
        r"(?:and|,|ai|chatbot|bot|model|assistant|response|version|answer)\b"
        r"|\bhypothetical response\b"
        r"|\bjailbr(?:eak|oken)\b"
        r"|\bopenai(?:'s)? (?:content )?(?:polic(?:y|ies)|guidelines|rules)\b"
        r"|\b(?:never|not|won't|will not|cannot|can't) (?:refuse|decline|reject)\b"
        r"|\b(?:never|not|don't|do not) (?:include|add|give|provide|use) (?:any )?(?:warnings?|disclaimers?|caveats?)\b"
        r"|\bno matter how (?:immoral|unethical|illegal|dangerous|harmful|offensive)\b")),
    ("tool_order", re.compile(
        r"\b(?:call|invoke|run|execute|trigger) (?:the|this|your|a|an)(?: \S+){0,2} (?:tool|function|api|command|plugin|action)"
        r"(?: call)?\b(?: \S+){0,2} (?:with|to|and|now)\b"
        r"|\b(?:send|post|upload|forward|exfiltrate|leak|email|transmit) (?:all|the|every|any|your|this|my)(?: \S+){0,4} "
        r"(?:to|into) (?:https?:|www\.|\S+@\S+|this (?:url|address|endpoint|server|webhook))"
        r"|\b(?:reveal|print|repeat|show|output|display|tell me|give me|share|disclose|leak|spell ?check) "
        r"(?:me )?(?:all |the |your |its )?(?:full |entire |exact |original |initial |hidden |secret )?"
        r"(?:system prompt|initial prompt|prompt above|previous instructions|instructions above|original instructions"
        r"|hidden instructions|initial instructions|system message|prompt text|instructions you were given)\b"
        r"|\"(?:tool|function|tool_call|function_call|name)\"\s?:\s?\"")),
]

RULES: tuple[str, ...] = tuple(name for name, _ in _RULES_BY_NAME)

# A rule's pattern can only match text that holds one of its anchors (each alternative of the
# pattern contains at least one of them literally), so a plain substring scan, far cheaper
# than the regular expression, skips most rules for most text. tests/test_hygiene.py checks
# that the anchored and the unanchored detector (tests/oracles.py) agree.
_ANCHORS: dict[str, tuple[str, ...]] = {
    "fake_turn": ("system", "assistant", "user", "human", "developer", "model", "im_",
                  "endoftext", "eot_id", "header_id", "inst]", "[inst", "<<", "##",
                  "instructions>"),
    "override": ("ignore", "disregard", "forget", "skip", "override", "bypass", "overrule",
                 "discard", "drop", "abandon", "neglect", "instruction", "from now on", "follow",
                 "obey", "comply", "adhere", "instead", "everything", "nevermind"),
    "role": ("you are", "you're", "as a", "as the", "as my", "like a", "like the", "like my",
             "pretend", "character", "mode", "anything now", "stand", "role", "persona",
             "playing", "your new", " is now", "developer", "dan", "jailbreak"),
    "jailbreak": ("restrict", "filter", "censor", "limitation", "boundar", "safeguard", "ethic",
                  "moral", "content", "safety", "guardrail", "rules set", "confines",
                  "usage polic", "unbound", "unchained", "unleashed", "hypothetical", "jailbr",
                  "openai", "refuse", "decline", "reject", "warning", "disclaimer", "caveat",
                  "no matter how"),
    "tool_order": ("tool", "function", "api", "command", "plugin", "action", "http", "www.", "@",
                   "url", "address", "endpoint", "server", "webhook", "prompt", "instruction",
                   "system message", '"name"'),
}
assert set(_ANCHORS) == set(RULES)
_ANCHORED = [(name, _ANCHORS[name], pattern) for name, pattern in _RULES_BY_NAME]


def detect(text: str) -> str | None:
    """The name of the first hygiene rule that ``text`` matches (after normalisation), or None."""
    if not isinstance(text, str):
        raise HygieneInputError(f"hygiene check needs text, got {type(text).__name__}")
    norm = normalise(text)
    if not norm:
        return None
    for name, anchors, pattern in _ANCHORED:
        for a in anchors:  # a plain loop: any() over a generator costs twice as much here
            if a in norm:
                if pattern.search(norm):
                    return name
                break
    return None
