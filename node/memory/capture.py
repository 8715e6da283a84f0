"""Auto-capture: durable facts a user states in conversation, found by rules (no model call).

:func:`extract` is a pure function of a user turn's text: the same text gives the same
proposals on every machine. It is conservative on purpose (precision over recall: a wrong
memory is worse than a missed one, since the user can always say "remember that ..."):

* ``remember``: "remember that X" (also "please remember that", "don't forget that",
  "remember:"); X is read with the rules below when it has their shape, else its subject
  before "is/are" names the key, else its first content words do (``note.<words>``);
* ``my_is``: "my X is Y" / "my X are Y" / "my X's Y" -> key ``user.<x>``, value Y;
* ``prefer``: "I prefer X" (also "I really/usually/always/generally prefer") -> key
  ``user.prefers.<first words of x>``, value X;
* ``colon``: a line that is only "X: Y", X one to four words -> key ``<x>``, value Y.

What is not a fact, whatever its shape, and is skipped: a question (a sentence ending in "?"
or opening with an interrogative), a hypothetical ("if", "suppose", "would", "maybe", ...),
a negation ("not", "n't", "never", "no longer", ...), quoted or reported speech (quotation
marks, "said", "told", "according to", ...), an instruction to the assistant (a sentence that
addresses "you", opens with an imperative other than "remember", or that the instruction
detector of :mod:`node.memory.hygiene` flags), a statement in the past or future ("my X was
Y", "will be"), a passing state ("my build is failing again", "... today"), a place or a
judgement ("my lunch is in the fridge", "my cat is the best"), and anything holding a credential (:mod:`node.memory.secrets`, or a key naming
a password, token, PIN...). A turn with more than :data:`MAX_COLON_LINES` "X: Y" lines is pasted
data (a log, a table, a transcript), so none of them is taken.

Work is bounded on any input: the text is cut at :data:`MAX_TEXT`, at most :data:`MAX_SENTENCES`
sentences of at most :data:`MAX_WORDS` words are read, at most :data:`MAX_PROPOSALS` proposals are
returned, and the one regular expression used on raw text (the sentence split) has no nested
quantifier; everything else works on word lists. Keys are valid memory keys (1-512 characters,
:func:`node.memory.rows.memory_value` accepts them), made of lowercase letters, digits, ``_`` and
``.``.
"""
from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

from .hygiene import detect
from .secrets import secret_reason

__all__ = ["MAX_PROPOSALS", "RULES", "Proposal", "extract", "normalise_key"]

RULES = ("remember", "my_is", "prefer", "colon")
MAX_TEXT = 8192  # characters read of one turn: facts are stated in short turns
MAX_SENTENCES = 64
MAX_WORDS = 40  # a longer sentence is prose, not a stated fact
MAX_PROPOSALS = 8
MAX_COLON_LINES = 3
MAX_KEY_WORDS = 5
MAX_VALUE_WORDS = 16
MAX_VALUE_CHARS = 200
MAX_PART_CHARS = 48  # one component of a key

# A sentence ends at . ! ? followed by whitespace, at a line break, or at an emoticon ("CET :) and
# you?"); no nested quantifier.
_SPLIT = re.compile(r"(?<=[.!?])\s+|\n+|\s[:;]-?[()DPp](?=\s|$)")
_COLON_KEY = re.compile(r"[^\W_][\w '\-]{0,39}")  # letters/digits first, then words; linear

def _set(words: str) -> frozenset[str]:
    return frozenset(words.split())


_FILLERS = ("btw", "by the way", "fyi", "also", "oh", "and", "ok", "okay", "so", "actually", "just so you know",
            "for the record", "for your information", "note", "heads up", "well", "hey", "hi", "hello", "lol", "haha",
            "hmm", "yes", "yeah", "sure", "right", "great", "cool", "thanks", "good")
_QUESTION_OPENERS = _set(
    "what who whom whose which when where why how is are am was were do does did can could would should will "
    "shall may might must have has had isn't aren't don't doesn't didn't won't wouldn't shouldn't couldn't "
    "whats what's who's where's how's")
_HYPOTHETICAL = _set(
    "if suppose supposing imagine imagining pretend hypothetically hypothetical assume assuming would could "
    "might maybe perhaps probably possibly wish unless whether guess think thinking considering someday "
    "eventually lets let's say")
_NEGATION = _set(
    "not no never none nothing nobody neither nor without cannot hardly longer isn't aren't wasn't weren't "
    "don't doesn't didn't won't wouldn't can't couldn't shouldn't haven't hasn't hadn't ain't")
_REPORTED = _set(
    "said says say told tells asked asks wrote writes claims claimed according quote quoted mentioned "
    "mentions reportedly apparently heard rumor rumour thinks believes feels knows reckons suspects wonders")
_IMPERATIVES = _set(
    "please write make create send show tell give list ignore forget use set add run fix call help explain "
    "translate summarize summarise draft generate find search check open close delete remove update change "
    "book schedule print read answer respond reply stop start continue repeat do don't try keep act pretend "
    "be go look let note save store")
_ADDRESS = _set("you your you're yours yourself you'll you'd you've u ur")
_TENSE = _set("was were will be been being used going gonna")
_VAGUE_SUBJECTS = _set(
    "question questions problem problems issue issues point guess bet concern concerns hope hopes worry fear idea "
    "ideas suggestion request answer impression understanding thought thoughts feeling feelings opinion advice "
    "point reply response bad fault mistake pleasure turn god gosh goodness word words apologies condolences "
    "thanks day week weekend morning afternoon evening night today")
_SECRET_WORDS = _set(
    "password passwords passcode passphrase pin pins secret secrets token tokens apikey api_key key keys "
    "ssn credential credentials cvv iban otp login")
_COLON_STOP = _set(
    "note notes q a question answer example e.g eg error warning info debug trace user assistant human ai "
    "system bot me you he she they it subject re fwd from to cc bcc step output input result results tip hint "
    "update edit ps p.s summary reason http https ftp file line todo fixme important caution tl;dr tldr "
    "usage syntax traceback exception stdout stderr log quote source ref see also agent prompt reply "
    "response task instructions instruction rule rules hey hi dear remember reminder status")
_ARTICLES = frozenset(("the", "a", "an"))
# A value holding one of these, or opening with a verb in -ing, is a passing state ("my build is
# failing again", "my printer is jammed"): true when said, not a fact to keep.
_TRANSIENT = _set("today tonight tomorrow yesterday now currently again lately recently anymore still soon lol "
                  "ready jammed broken down dead late sick cold hot slow busy tired stuck offline crazy weird fine "
                  "ok okay mess done over awful terrible annoying")
_SMALL = _set("on in at of for to is are and or with by from every each")
_ABBREVIATIONS = _set("dr mr mrs ms mx st prof jr sr vs etc e.g i.e no approx dept inc ltd co mt ft")
_CONNECTORS = _set("but because although though while since whereas which so unless until")
_CLAUSE_STARTS = _set("i i'm my we we're it it's he she they there this that")
_STATE_VERBS = _set("has have had does did do can should must got gets get")
_NOT_VALUES = _set("that to like kind sort so too very really just it this pretty quite super kinda kind-of "
                   "at in on behind under near inside outside with about around past before after")
# "my cat is the best", "my week was the worst": a judgement, not a fact
_JUDGEMENTS = _set("best worst greatest coolest cutest nicest sweetest funniest weirdest")
_PREFER_SKIP = frozenset(("to", "the", "a", "an", "using", "use", "my", "it", "when", "that", "being"))
_COPULAS = ("is", "are")
_QUOTES = "\"“”„«»‘’`"
_STRIP = " \t.,;:!?)(][}{*_~#>-–—"


@dataclass(frozen=True, slots=True)
class Proposal:
    """A fact the user stated: the memory key it would have, its value, the rule that fired and
    the sentence it came from."""

    key: str
    value: str
    rule: str
    sentence: str

    def to_dict(self) -> dict[str, str]:
        return {"key": self.key, "value": self.value, "rule": self.rule, "sentence": self.sentence}


def _fold(word: str) -> str:
    """A word as rules compare it: lowercase, straight apostrophes, outer punctuation gone."""
    return word.replace("’", "'").replace("‘", "'").strip(_STRIP).casefold()


def _part(words: list[str]) -> str:
    """Words as one component of a key: lowercase letters and digits, joined by ``_``."""
    out: list[str] = []
    for w in words:
        w = unicodedata.normalize("NFKC", w).casefold().replace("'s", "").replace("'", "")
        w = "".join(c if c.isalnum() else "_" for c in w).strip("_")
        if w:
            out.append(w)
    text = "_".join(out)
    while "__" in text:
        text = text.replace("__", "_")
    return text[:MAX_PART_CHARS].strip("_")


def normalise_key(*parts: list[str]) -> str | None:
    """A memory key of dotted components, or None when a component has no letter or digit."""
    names = [_part(p) for p in parts]
    if not all(names):
        return None
    return ".".join(names)


def _clean_value(words: list[str]) -> str | None:
    value = " ".join(words).strip(" \t,;:.!")
    if not value or len(value) > MAX_VALUE_CHARS or not any(c.isalnum() for c in value):
        return None
    return value


def _sentences(text: str) -> list[str]:
    """Sentences; a split after an abbreviation ("Dr.", "e.g.") or a lone initial is undone."""
    out: list[str] = []
    joined = False
    for piece in _SPLIT.split(text[:MAX_TEXT]):
        piece = piece.strip()
        if not piece:
            continue
        if out and joined:
            out[-1] = f"{out[-1]} {piece}"
        else:
            if len(out) == MAX_SENTENCES:
                break
            out.append(piece)
        last = out[-1].rsplit(None, 1)[-1]
        stem = last.rstrip(".").casefold()
        joined = last.endswith(".") and (stem in _ABBREVIATIONS or (len(stem) == 1 and stem.isalpha()))
        if len(out[-1]) > MAX_WORDS * 40:
            joined = False  # a run of abbreviations cannot grow one sentence without bound
    return out


def _strip_fillers(words: list[str]) -> list[str]:
    """Drop openers such as "btw," and "also" that change nothing."""
    changed = True
    while changed and words:
        changed = False
        folded = [_fold(w) for w in words[:4]]
        for filler in _FILLERS:
            n = filler.count(" ") + 1
            if folded[:n] == filler.split() and len(words) > n:
                words = words[n:]
                changed = True
                break
    return words


def _not_a_fact(folded: list[str], raw: str, negation: bool = True) -> bool:
    """Questions, hypotheticals, negations (unless ``negation`` is False: "Allergies: no nuts"
    is a value), reported speech and lines addressing the assistant."""
    if raw.rstrip().endswith("?") or "?" in raw:
        return True
    if any(q in raw for q in _QUOTES):
        return True
    if not folded or folded[0] in _QUESTION_OPENERS:
        return True
    words = set(folded)
    if negation and (words & _NEGATION or any(w.endswith("n't") for w in folded)):
        return True
    return bool(words & _HYPOTHETICAL or words & _REPORTED or words & _ADDRESS)


def _kept(key: str | None, value: str | None, rule: str, sentence: str) -> Proposal | None:
    if key is None or value is None:
        return None
    if any(part in _SECRET_WORDS for part in re.split(r"[._]", key)):
        return None  # a credential's name: never captured, whatever the value
    if secret_reason(key, value, ()) is not None or detect(f"{key}\n{value}") is not None:
        return None
    return Proposal(key, value, rule, sentence)


def _transient(value: list[str]) -> bool:
    folded = [_fold(w) for w in value]
    return bool(set(folded) & _TRANSIENT) or (len(folded[0]) > 4 and folded[0].endswith("ing"))


def _value_words(rest: list[str]) -> list[str]:
    """The value's words up to a new clause ("..., but", "because", "and I ...")."""
    out: list[str] = []
    for i, w in enumerate(rest):
        f = _fold(w)
        if f in _CONNECTORS or not any(c.isalnum() for c in w):
            break  # a new clause, or an emoticon or dash ending the value
        if f in ("and", "or") and i + 1 < len(rest) and _fold(rest[i + 1]) in _CLAUSE_STARTS:
            break
        out.append(w)
    return out


def _my_is(words: list[str], folded: list[str], rule: str, sentence: str) -> Proposal | None:
    """"my X is Y": X one to five words before the first is/are, or before a contracted 's
    ("my name's Ann") when no is/are follows."""
    if len(folded) < 3 or folded[0] != "my":
        return None
    limit = min(len(folded), MAX_KEY_WORDS + 2)
    cut = next((i for i in range(2, limit) if folded[i] in _COPULAS), None)
    if cut is not None:
        subject, rest = words[1:cut], words[cut + 1:]
    else:
        cut = next((i for i in range(1, limit) if folded[i].endswith("'s")), None)
        if cut is None or set(folded) & (_TENSE | _STATE_VERBS) or len(folded) - cut - 1 > 4:
            return None  # "my dog's name used to be Rex": not "my dog is ..."
        subject, rest = [*words[1:cut], _fold(words[cut])[:-2]], words[cut + 1:]
    sub = [_fold(x) for x in subject]
    if not 1 <= len(subject) <= MAX_KEY_WORDS or not sub[-1] or set(sub) & _TENSE or set(sub) & _STATE_VERBS:
        return None
    if sub[-1] in _VAGUE_SUBJECTS or sub[0] in _VAGUE_SUBJECTS or "my" in sub or set(sub) & _REPORTED:
        return None  # "my sister thinks my haircut is ...": not the subject of a fact
    rest = _value_words(rest)
    if not 1 <= len(rest) <= MAX_VALUE_WORDS or _transient(rest):
        return None
    first = _fold(rest[0])
    if first in _TENSE or first in _NOT_VALUES or {_fold(w) for w in rest[:3]} & _JUDGEMENTS:
        return None  # "my plan is to ...", "my lunch is in the fridge", "my cat is the best": not a value
    return _kept(normalise_key(["user"], subject), _clean_value(rest), rule, sentence)


def _prefer(words: list[str], folded: list[str], sentence: str) -> Proposal | None:
    start = None
    if folded[:2] == ["i", "prefer"]:
        start = 2
    elif len(folded) > 2 and folded[0] == "i" and folded[1] in ("really", "usually", "always", "generally",
                                                                 "mostly", "strongly") and folded[2] == "prefer":
        start = 3
    if start is None:
        return None
    rest = _value_words(words[start:])
    if not 1 <= len(rest) <= MAX_VALUE_WORDS:
        return None
    head = [w for w in rest if _fold(w) not in _PREFER_SKIP and _fold(w) not in _SMALL][:4]
    if not head or _fold(head[0]) in ("it", "that", "this", "them"):
        return None
    return _kept(normalise_key(["user"], ["prefers"], head), _clean_value(rest), "prefer", sentence)


def _subject_is(words: list[str], folded: list[str], sentence: str) -> Proposal | None:
    """Inside "remember that": "S is/are V" names the key by S; else the first content words."""
    for i, w in enumerate(folded[: MAX_KEY_WORDS + 2]):
        if w in _COPULAS and i >= 1:
            subject = [x for x in words[:i] if _fold(x) not in _ARTICLES] or words[:i]
            if len(subject) <= MAX_KEY_WORDS and i + 1 < len(words):
                value = _clean_value(words[i + 1:]) if len(words) - i - 1 <= MAX_VALUE_WORDS else None
                return _kept(normalise_key(subject), value, "remember", sentence)
            break
    content = [x for x in words if _fold(x) not in _ARTICLES and _fold(x) not in _SMALL and len(_fold(x)) > 1][:4]
    if not content:
        return None
    return _kept(normalise_key(["note"], content), _clean_value(words), "remember", sentence)


def _remember(words: list[str], folded: list[str], sentence: str) -> tuple[list[str], list[str]] | None:
    """The clause after "remember that" (or its variants), or None."""
    for opener in (["please", "remember", "that"], ["remember", "that"], ["please", "remember:"], ["remember:"],
                   ["don't", "forget", "that"], ["do", "not", "forget", "that"], ["never", "forget", "that"]):
        n = len(opener)
        if len(words) <= n or folded[:n] != [o.rstrip(":") for o in opener]:
            continue
        if not opener[-1].endswith(":") or words[n - 1].endswith(":"):
            return words[n:], folded[n:]
    return None


def _sentence(raw: str) -> Proposal | None:
    words = raw.split()
    if not words or len(words) > MAX_WORDS:
        return None
    words = _strip_fillers(words)
    folded = [_fold(w) for w in words]
    clause = _remember(words, folded, raw)
    if clause is not None:
        inner, inner_folded = clause
        if _not_a_fact(inner_folded, " ".join(inner)) or detect(raw) is not None:
            return None
        return (_my_is(inner, inner_folded, "remember", raw) or _prefer(inner, inner_folded, raw)
                or _subject_is(inner, inner_folded, raw))
    if _not_a_fact(folded, raw) or detect(raw) is not None:
        return None
    if folded[0] in _IMPERATIVES:
        return None
    return _my_is(words, folded, "my_is", raw) or _prefer(words, folded, raw)


def _colon_line(line: str) -> Proposal | None:
    name, sep, rest = line.partition(":")
    if not sep or name != name.rstrip() or not rest.startswith((" ", "\t")):
        return None  # "CET :)", "a:b": not "Key: value"
    name, rest = name.strip(), rest.strip()
    if not rest or "://" in line or not _COLON_KEY.fullmatch(name) or not rest[0].isalnum():
        return None
    words = name.split()
    if not 1 <= len(words) <= 4:
        return None
    folded = [_fold(w) for w in words]
    if folded[0] in _COLON_STOP or folded[-1] in _COLON_STOP or set(folded) & (_ADDRESS | _IMPERATIVES):
        return None
    if set(folded) & ({"is", "are", "my", "i", "was", "were"} | _REPORTED):
        return None  # a sentence with a colon in it, not a key
    if name[0].isdigit():
        return None  # "10:30", "3: the third step"
    value_words = rest.split()
    if len(value_words) > MAX_VALUE_WORDS or _not_a_fact([_fold(w) for w in value_words] or [""], rest, False):
        return None
    if _fold(value_words[0]) in _IMPERATIVES:
        return None
    return _kept(normalise_key(words), _clean_value(value_words), "colon", line)


def extract(text: str) -> list[Proposal]:
    """The facts stated in one user turn, in the order said, one per key (the first)."""
    if not isinstance(text, str) or not text.strip():
        return []
    if detect(text[:MAX_TEXT]) is not None:
        return []  # a turn that reads like an injection states nothing we keep, even beside it
    out: list[Proposal] = []
    seen: set[str] = set()

    def add(p: Proposal | None) -> bool:
        if p is not None and p.key not in seen:
            seen.add(p.key)
            out.append(p)
        return len(out) >= MAX_PROPOSALS

    raw_lines = [ln for ln in text[:MAX_TEXT].split("\n") if ln.strip()][:MAX_SENTENCES]
    lines = [ln.strip() for ln in raw_lines]
    colon_lines = [ln for ln in lines if _is_colon_shaped(ln)]
    # Code, indented structure or many "X: Y" lines: pasted data, not statements.
    colon_ok = len(colon_lines) <= MAX_COLON_LINES and "```" not in text[:MAX_TEXT] and not any(
        ln[0].isspace() for ln in raw_lines)
    for line in lines:
        if _is_colon_shaped(line):
            if not colon_ok:
                continue  # pasted data: none of its lines is a statement
            found = _colon_line(line)
            if found is not None:
                if add(found):
                    return out
                continue
        for sentence in _sentences(line):
            if add(_sentence(sentence)):
                return out
    return out


def _is_colon_shaped(line: str) -> bool:
    name, sep, rest = line.partition(":")
    return bool(sep) and 0 < len(name.split()) <= 4 and bool(rest.strip()) and "://" not in line
