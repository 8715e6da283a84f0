"""Secret detection: does a memory hold a credential that was stored by mistake?

Recalled text goes into a model's prompt, so a memory that holds an API key or a password
leaks it to every model (and log) that sees the prompt. :func:`find_secret` names the first
credential in a text; :func:`secret_reason` says why a row counts as secret: its
``contains-secrets`` tag (:data:`SECRETS_TAG`) or a credential in its key or value.

Detected: the formats of detect-secrets' regex plugins (AWS access key ids and quoted secret
keys, GitHub, GitLab, OpenAI, Stripe, Slack tokens and webhooks, PEM and PuTTY private keys,
JWTs, ``scheme://user:password@host``, Twilio, SendGrid, Mailchimp, npm, PyPI, Azure storage,
Artifactory, IBM Cloud IAM and COS HMAC, Square, Discord, Telegram, Cloudant, SoftLayer);
memmesh's own private keys (``ed25519-private:<43 base64url>``) and ticket invite secrets
(``#secret=<43 base64url>``); and keyword assignments read by detect-secrets' KeywordDetector
expressions (``password: hunter2``, ``api_key = ...``, ``DB_PASSWORD := ...``) when the
value's first word has six characters or more, a letter, and is no plain word (it mixes
letters with digits or symbols, or mixes case inside: ``hunter2``, ``Tr0ub4dor&3``; words
joined by ``_ . - '`` such as ``plain_value`` are plain), and is no template (``{{ pw }}``, ``${PW}``), path or call (``getpass()``, ``os.environ[``). Answers are
the plugins' ``secret_type`` (``"AWS Access Key"``, ``"Secret Keyword"``); the memmesh formats
answer ``"memmesh Private Key"`` and ``"memmesh Invite Secret"``.

Not detected: a scanner is not a proof. Passwords in prose ("my password is hunter2"),
keyword values that are plain words or digits ("password: letmein"), passphrases, formats
without a plugin, and anything split across lines or memories pass. Left out on purpose
(bench/credentials.py measures each): the high-entropy plugins (the hex one flags entry ids
``sha256:<64 hex>``, commit hashes and UUIDs; the base64 one flags every memmesh public key
``ed25519:<43 base64url>`` and ticket; memories quote all of them all the time), keyword
matches whose value reads as prose ("the secret: practice"), and the public-IPv4 plugin (an
address is no credential).

Why detect-secrets (Yelp, Apache-2.0, 1.5): well kept and widely used (pre-commit hooks, CI),
pure Python, and each plugin is a class with ``analyze_string``, so its expressions run here
one by one on a string: no files, no baseline, no global settings, no network (verification,
which calls vendors' APIs through ``requests``, lives in ``analyze_line`` and ``verify``,
never called here). gitleaks and trufflehog are Go programs, not Python libraries: a
subprocess per write.

Deterministic: the answer depends on the text, the detect-secrets version and the Unicode
database of the Python in use (case-insensitive matching, ``\\w``, ``\\d``); no randomness,
clock or configuration file.

Cost: a pre-filter runs first. Every plugin is paired with a necessary condition of a match:
a run of 20 token characters (:data:`_RUN`) for the formats that contain one, a literal
(``eyJ``, ``://``, ``xox``, a keyword stem ...) otherwise; text that meets none is answered
without the library, and on the rest only the plugins whose condition holds run. The
pre-filter never changes an answer (tests and bench/credentials.py compare with a scan that
runs every plugin everywhere, tests/oracles.py). Measured by bench/credentials.py on a shared 2-core machine: 4-7
microseconds per ordinary chat turn (1.1 % of them pass the pre-filter), about 20 per
credential, against 0.2-0.4 milliseconds per line for detect-secrets' own ``scan_line`` with
every plugin. detect-secrets itself is imported on the first text that passes the pre-filter
(about 0.2 s, once per process), so importing this module costs nothing.

Bounds: the first :data:`MAX_CHARS` characters (a memory value's maximum size) are scanned,
line by line (``str.splitlines``); a line longer than :data:`WINDOW` is scanned in windows of
:data:`WINDOW` characters every :data:`STEP`, so a credential of up to ``WINDOW - STEP``
characters always lies whole in one window. At most :data:`MAX_SCANS` lines or windows that
pass the pre-filter are scanned per text; what follows is not. Some detect-secrets
expressions are quadratic or cubic on crafted text (npm's ``//.+/:_authToken=``, OpenAI's
``sk-[...]*...T3BlbkFJ``, the JWT's ``eyJ[...]+\\.``, the keyword expressions on long words,
the IBM, Cloudant and SoftLayer assignments on runs of spaces). So runs of spaces are
collapsed to one; npm and OpenAI run only where an exact linear test says they match; the
JWT and keyword expressions run only on the tokens and assignments a linear scan finds, at
most :data:`MAX_CANDIDATES` of each per window. Time is then linear in the text, about
0.1-0.2 s for the worst 64 KiB found (bench/credentials.py).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from memmesh.auth.errors import MemmeshError

SECRETS_TAG = "contains-secrets"

MAX_CHARS = 65_536
WINDOW = 2048
STEP = 1024
MAX_CANDIDATES = 16
MAX_SCANS = 512

# Characters of every run a plugin's match must contain (base64, base64url, hex, the
# backslash of Square's class, any Unicode digit for Discord's \d), plus the four non-ASCII
# letters that Python's case-insensitive matching equates with ASCII ones (the IBM, Cloudant
# and SoftLayer expressions ignore case). The shortest such run in a match is 20 (AKIA + 16).
_RUN = re.compile(r"[\dA-Za-z_+/=\\\-\u0130\u0131\u017f\u212a]{20}")
_ARTIFACTORY = re.compile(r"A(?:KC|P[\dA-F])[a-zA-Z0-9]{8}")
# Python's re.IGNORECASE equates these with ASCII letters; str.lower() leaves the dotless i
# and the long s alone and turns U+0130 into two characters, so they are mapped first.
_FOLD = str.maketrans({"\u0130": "i", "\u0131": "i", "\u017f": "s", "\u212a": "k"})
# Every word of detect-secrets' keyword DENYLIST holds one of these (tests/test_secrets.py
# checks): a cheap test before the DENYLIST expression itself.
_STEMS = ("key", "pass", "pwd", "secret", "contrase")
# A keyword, more word characters, then what the keyword expressions want before the value.
_WORD_TAIL = re.compile(r"\w*+")
_ASSIGN = re.compile(r"""[]'"]{0,2}\s*(?::=?|={1,3}|!==?)""")
_VALUE_CHARS = 256
# Whatever a plugin's condition needs: one of these, a _RUN or an _ARTIFACTORY match.
_LITERALS = (*_STEMS, "xox", "eyj", "://", "_authtoken=")
_SPACES = re.compile(" {2,}")

_OPENAI_RUN = re.compile(r"[A-Za-z0-9_-]+")
_OPENAI_CORE = re.compile(r"[A-Za-z0-9]{20}T3BlbkFJ[A-Za-z0-9]{20}")
_NPM_SUFFIX = re.compile(r"/:_authToken=\s*(?:npm_.|[A-Fa-f0-9-]{36})")
_JWT_PART = re.compile(r"(?<![A-Za-z0-9_=-])[A-Za-z0-9_=-]++(?=\.[A-Za-z0-9_=-])")
_JWT_NEXT = re.compile(r"\.[A-Za-z0-9_=-]++\.?")
_MEMMESH_KEY = re.compile(r"ed25519-private:[A-Za-z0-9_-]{43}(?![A-Za-z0-9_-])")
_MEMMESH_INVITE = re.compile(r"[#&?]secret=[A-Za-z0-9_-]{43}(?![A-Za-z0-9_-])")

_MIN_KEYWORD_VALUE = 6
_TRAILING = ".,;:!?)]}>\"'"

_WORD_PARTS = re.compile(r"['\u2019._-]")
_PATH_OR_CALL = re.compile(r"(?:~?\.{0,2}/|[A-Za-z]:\\|[\w.-]+[\[(]|\w+://)")


def _word_end(text: str, pos: int) -> int:
    """Where the word going on at ``pos`` ends (``pos`` itself when none does)."""
    tail = _WORD_TAIL.match(text, pos)
    return pos if tail is None else tail.end()  # \w*+ matches, empty at worst


class SecretsInputError(MemmeshError):
    """:func:`find_secret` or :func:`secret_reason` was given something that is not text."""


class SecretsLibraryMissing(MemmeshError):
    """detect-secrets is not installed in this Python."""


def _lower(text: str) -> str:
    """``text`` lower-cased so that a literal matched case-insensitively by re is found in it."""
    return (text if text.isascii() else text.translate(_FOLD)).lower()


class _Window:
    """One piece of a line and, computed on first use, what the plugin conditions test."""

    def __init__(self, text: str):
        self.text = text

    @functools.cached_property
    def low(self) -> str:
        return _lower(self.text)

    @functools.cached_property
    def run(self) -> bool:
        return _RUN.search(self.text) is not None

    @functools.cached_property
    def assignments(self) -> list[tuple[int, int]]:
        """``(start, end)`` of the first MAX_CANDIDATES keyword assignments: a word that holds
        a DENYLIST keyword, then closing quotes or brackets, spaces and ``:``, ``:=``, ``=``
        or ``!=``. ``start`` is the word's last keyword: the expressions accept a keyword
        anywhere in a word, and started earlier they would rescan a long word of keywords
        once per keyword. (Folding and lower-casing keep every character at its index.)"""
        found: list[tuple[int, int]] = []
        low, denylist = self.low, _denylist()
        pos = 0
        while len(found) < MAX_CANDIDATES and (m := denylist.search(low, pos)) is not None:
            end = _word_end(low, m.end())
            start = m.start()
            while (later := denylist.search(low, start + 1, end)) is not None:
                start = later.start()
            sign = _ASSIGN.match(self.text, end)
            if sign is not None:
                found.append((start, sign.end()))
            pos = end
        return found


@dataclass(frozen=True)
class _Plugin:
    secret_type: str
    may_match: Callable[[_Window], bool]  # necessary for a match: the pre-filter
    matches: Callable[[_Window], bool]


def _has(*literals: str) -> Callable[[_Window], bool]:
    return lambda w: any(lit in w.low for lit in literals)


def _run_and(*literals: str) -> Callable[[_Window], bool]:
    return lambda w: w.run and any(lit in w.low for lit in literals)


def _by_run(w: _Window) -> bool:
    return w.run


def _regex(plugin) -> Callable[[str], bool]:
    # analyze_string only runs the plugin's expressions; analyze_line would also read
    # detect-secrets' global settings and could verify a match over the network.
    return lambda s: next(iter(plugin.analyze_string(s)), None) is not None


def _on_window(test: Callable[[str], bool]) -> Callable[[_Window], bool]:
    return lambda w: test(w.text)


@functools.cache
def _denylist() -> re.Pattern[str]:
    """detect-secrets' keyword words, to be searched in lower-cased text."""
    from detect_secrets.plugins import keyword as kw

    return re.compile("|".join(kw.DENYLIST))


@functools.cache
def _plugins() -> tuple[_Plugin, ...]:
    """The default plugin set, most specific first (the first that matches names the text)."""
    try:
        from detect_secrets.plugins import (
            artifactory,
            aws,
            azure_storage_key,
            basic_auth,
            cloudant,
            discord,
            github_token,
            gitlab_token,
            ibm_cloud_iam,
            ibm_cos_hmac,
            jwt,
            mailchimp,
            npm,
            openai,
            private_key,
            pypi_token,
            sendgrid,
            slack,
            softlayer,
            square_oauth,
            stripe,
            telegram_token,
            twilio,
        )
    except ImportError as exc:
        raise SecretsLibraryMissing(
            "secret detection needs the detect-secrets package: "
            "pip install 'detect-secrets>=1.5,<2'") from exc

    def plain(cls, may_match: Callable[[_Window], bool]) -> _Plugin:
        return _Plugin(cls.secret_type, may_match, _on_window(_regex(cls())))

    assignment_words = ("key", "pwd", "pass", "token")
    return (
        _Plugin("memmesh Private Key", _has("ed25519-private:"),
                _on_window(lambda s: _MEMMESH_KEY.search(s) is not None)),
        _Plugin("memmesh Invite Secret", _has("secret="),
                _on_window(lambda s: _MEMMESH_INVITE.search(s) is not None)),
        plain(private_key.PrivateKeyDetector, _has("private key", "putty-user-key-file-2")),
        plain(aws.AWSKeyDetector, _by_run),
        plain(github_token.GitHubTokenDetector, _by_run),
        plain(gitlab_token.GitLabTokenDetector, _by_run),
        _Plugin(openai.OpenAIDetector.secret_type, _has("t3blbkfj"), _openai(openai.OpenAIDetector())),
        plain(stripe.StripeDetector, _by_run),
        plain(slack.SlackDetector, _has("xox", "hooks.slack.com")),
        plain(twilio.TwilioKeyDetector, _by_run),
        plain(sendgrid.SendGridDetector, _by_run),
        plain(mailchimp.MailchimpDetector, _by_run),
        _Plugin(npm.NpmDetector.secret_type, _has("_authtoken="), _npm(npm.NpmDetector())),
        plain(pypi_token.PypiTokenDetector, _by_run),
        plain(azure_storage_key.AzureStorageKeyDetector, _by_run),
        plain(artifactory.ArtifactoryDetector, lambda w: _ARTIFACTORY.search(w.text) is not None),
        plain(ibm_cloud_iam.IbmCloudIamDetector, _run_and(*assignment_words)),
        plain(square_oauth.SquareOAuthDetector, _by_run),
        plain(discord.DiscordBotTokenDetector, _by_run),
        plain(telegram_token.TelegramBotTokenDetector, _by_run),
        plain(cloudant.CloudantDetector, _run_and(*assignment_words, "cloudant.com")),
        plain(softlayer.SoftlayerDetector, _run_and(*assignment_words, "softlayer")),
        plain(ibm_cos_hmac.IbmCosHmacDetector, _run_and("secret")),
        _Plugin(jwt.JwtTokenDetector.secret_type, _has("eyj"), _jwt(jwt.JwtTokenDetector)),
        plain(basic_auth.BasicAuthDetector, _has("://")),
        _Plugin("Secret Keyword", lambda w: bool(w.assignments), _keyword()),
    )


def _openai(detector) -> Callable[[_Window], bool]:
    # A match lies inside one run of [A-Za-z0-9_-]: it exists exactly when the run holds
    # "sk-" and, after its first one, the key's core. Only then does the plugin run, and it
    # then succeeds from that first "sk-" in linear time.
    match = _regex(detector)

    def matches(w: _Window) -> bool:
        for m in _OPENAI_RUN.finditer(w.text):
            run = m.group()
            first = run.find("sk-")
            if first >= 0 and _OPENAI_CORE.search(run, first + 3) and match(run):
                return True
        return False

    return matches


def _npm(detector) -> Callable[[_Window], bool]:
    # "//", at least one character, then the token: exactly when the token follows the first
    # "//" by three characters or more. Then the plugin succeeds from that "//" at once.
    match = _regex(detector)

    def matches(w: _Window) -> bool:
        first = w.text.find("//")
        return (first >= 0 and _NPM_SUFFIX.search(w.text, first + 3) is not None
                and match(w.text))

    return matches


def _jwt(detector) -> Callable[[_Window], bool]:
    # A JWT match is "eyJ" inside a run of [A-Za-z0-9_=-] that a dot and another such run
    # follow; the expression runs on each such header.payload pair only. Its formal check
    # lets json.loads raise RecursionError on a deeply nested header (detect-secrets 1.5.0).
    pattern = detector.denylist[0]

    def valid(token: str) -> bool:
        try:
            return detector.is_formally_valid(token)
        except RecursionError:
            return False

    def matches(w: _Window) -> bool:
        text = w.text
        tried = 0
        for m in _JWT_PART.finditer(text):
            if m.group().find("eyJ", 0, len(m.group()) - 1) < 0:
                continue
            tail = _JWT_NEXT.match(text, m.end())
            if tail is None:  # the finder's pattern ends where a next part starts: never here
                continue
            if any(valid(t) for t in pattern.findall(text, m.start(), tail.end())):
                return True
            tried += 1
            if tried == MAX_CANDIDATES:
                break
        return False

    return matches


def _plain_word(word: str) -> bool:
    # Words, also joined by hyphens, apostrophes, dots or underscores ("plain_value",
    # "config.yaml"): names and prose, not credentials.
    return all(part.isalpha() and (part.islower() or part.isupper() or part.istitle())
               for part in _WORD_PARTS.split(word))


def _keyword() -> Callable[[_Window], bool]:
    from detect_secrets.filters import heuristic as h
    from detect_secrets.plugins import keyword as kw

    # The unquoted forms of detect-secrets' config-file expressions ("key: value",
    # "key = value", "key := value"), with the group that holds the value: memories are
    # notes, not source code, so quotes cannot be required.
    expressions = ((kw.FOLLOWED_BY_COLON_EQUAL_SIGNS_REGEX, 4), (kw.FOLLOWED_BY_COLON_REGEX, 4),
                   (kw.FOLLOWED_BY_EQUAL_SIGNS_REGEX, 5))

    def credential_like(value: str) -> bool:
        value = value.strip()
        if not value or h.is_templated_secret(value) or h.is_prefixed_with_dollar_sign(value):
            return False
        word = value.split()[0].rstrip(_TRAILING)
        return not (len(word) < _MIN_KEYWORD_VALUE or _plain_word(word)
                    or h.is_not_alphanumeric_string(word) or h.is_sequential_string(word)
                    or h.is_potential_uuid(word) or h.is_templated_secret(word)
                    or h.is_prefixed_with_dollar_sign(word) or _PATH_OR_CALL.match(word))

    def matches(w: _Window) -> bool:
        for start, end in w.assignments:
            piece = w.text[start:end + _VALUE_CHARS]
            for expression, group in expressions:
                m = expression.match(piece)
                if m is not None and credential_like(m.group(group)):
                    return True
        return False

    return matches


def _windows(text: str) -> Iterator[str]:
    for line in text.splitlines():
        if len(line) <= WINDOW:
            if line:
                yield line
            continue
        for start in range(0, len(line) - WINDOW + STEP, STEP):
            yield line[start:start + WINDOW]


def _may_hold(text: str) -> bool:
    """The pre-filter on a whole text: could any plugin match somewhere in it?"""
    low = _lower(text)
    for lit in _LITERALS:
        if lit in low:
            return True
    return _RUN.search(text) is not None or _ARTIFACTORY.search(text) is not None


def _scan(text: str, prefilter: bool) -> str | None:
    if "  " in text:
        # The IBM, Cloudant and SoftLayer assignment expressions are cubic in a run of spaces.
        text = _SPACES.sub(" ", text)
    plugins = _plugins()
    scans = 0
    for piece in _windows(text):
        # The budget counts the same windows with and without the pre-filter, so that the
        # two answers can be compared on any text.
        if _may_hold(piece):
            scans += 1
            if scans > MAX_SCANS:
                return None
        elif prefilter:
            continue
        w = _Window(piece)
        for p in plugins:
            if (not prefilter or p.may_match(w)) and p.matches(w):
                return p.secret_type
    return None


def find_secret(text: str) -> str | None:
    """The ``secret_type`` of the first credential in ``text`` (lines in order, plugins in
    the order of the default set), or ``None``. See the module docstring for what is found
    and how long text is bounded."""
    if not isinstance(text, str):
        raise SecretsInputError(f"find_secret takes a str, got {type(text).__name__}")
    text = text[:MAX_CHARS]
    if not _may_hold(text):
        return None
    return _scan(text, prefilter=True)


def secret_reason(key: str, value: str, tags: Sequence[str]) -> str | None:
    """Why a row is secret: ``"tagged"`` (a tag equal to :data:`SECRETS_TAG` after casefold),
    else :func:`find_secret` of the key and the value, else ``None``.

    They are scanned as ``key + ": " + value``, so a key that names a password
    (``db.password``) and a value that looks like one read as one keyword assignment."""
    if not isinstance(key, str) or not isinstance(value, str):
        raise SecretsInputError("secret_reason takes a str key and a str value")
    if isinstance(tags, str) or not all(isinstance(t, str) for t in tags):
        raise SecretsInputError("secret_reason takes a sequence of str tags")
    folded = SECRETS_TAG.casefold()
    if any(t.casefold() == folded for t in tags):
        return "tagged"
    return find_secret(f"{key}: {value}")
