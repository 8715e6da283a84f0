"""Secret-detection benchmark (issue 11 item 4): node.memory.secrets.find_secret.

Usage::

    python bench/credentials.py [--json PATH] [--per-format N] [--seed S] [--show N]

Measured:

* false flags: the share of ordinary chat turns (every non-blank message of the
  ``chitchat-dataset`` package, the ``bench`` extra, MIT) that ``find_secret`` flags, and of
  identifiers memories quote all the time (entry ids ``sha256:<64 hex>``, commit hashes,
  UUIDs, memmesh public keys and tickets without their secret, URLs without credentials);
* detection: the share of synthetic credentials of every supported format that are found,
  and found under their own plugin name. They are generated with a seeded ``random.Random``
  (no real keys), each put in one of a few neutral sentences;
* time: microseconds per chat turn and per credential, and the worst crafted 64 KiB inputs;
* soundness of the pre-filter: texts on which ``find_secret`` and the scan without the
  pre-filter disagree (must be 0);
* the evidence for the plugins left out of the default set: detect-secrets' high-entropy
  plugins (default limits, unquoted tokens as its ad-hoc scan reads them), its raw keyword
  expressions (without the value rule), and its own ``scan_line`` with every plugin (on a
  sample of chat turns: share with any result, milliseconds per line).

Nothing here touches the network: verification stays off (only ``analyze_string`` and
``scan_line`` without the verification filter are used).
"""

from __future__ import annotations

import argparse
import base64
import json
import random
import string
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._common import machine, need  # noqa: E402
from memmesh.auth.keys import SigningKey  # noqa: E402
from memmesh.node.memory import secrets  # noqa: E402
from memmesh.tickets import encode, issue  # noqa: E402
from tests.oracles import find_secret_unfiltered  # noqa: E402

ALNUM = string.ascii_letters + string.digits
UPNUM = string.ascii_uppercase + string.digits
LOWNUM = string.ascii_lowercase + string.digits
HEX = "0123456789abcdef"
B64 = ALNUM + "+/"
B64URL = ALNUM + "-_"
SENTENCES = ("{}", "use {} for the deploy", "the value is {} (staging)", "line one\n{}\nline three",
             "Note to self: {} expires next month.")
SCAN_LINE_SAMPLE = 2000


def load_chat() -> list[str]:
    chitchat = need("chitchat_dataset", "chitchat-dataset", "secrets")
    return [m for m in chitchat.MessageDataset() if m.strip()]


def machine_line() -> str:
    m = machine()
    return f"{m['cpu']}, {m['cores']} cores, {m['system']}, Python {m['python']}"


def b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def credentials(rnd: random.Random, n: int) -> dict[str, list[tuple[str, str]]]:
    """``format -> [(expected secret_type, text)]``, ``n`` of each, all synthetic."""

    def s(alphabet: str, k: int) -> str:
        return "".join(rnd.choice(alphabet) for _ in range(k))

    def password() -> str:
        word = rnd.choice(["summer", "Dragon", "monkey", "Berlin", "coffee", "Tr0ub4dor"])
        return word + str(rnd.randint(1, 9999)) + rnd.choice(["", "!", "#", "_x"])

    def jwt() -> str:
        head = b64url(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
        body = b64url(json.dumps({"sub": str(rnd.randint(1, 10**9)), "iat": rnd.randint(10**9, 2 * 10**9)}).encode())
        return f"{head}.{body}.{b64url(rnd.randbytes(32))}"

    def invite() -> str:
        issuer, guest = SigningKey.from_seed(rnd.randbytes(32)), SigningKey.from_seed(rnd.randbytes(32))
        return encode(issue(issuer=issuer, db="sha256:" + s(HEX, 64), addresses=["http:127.0.0.1:7000"],
                            perm="read", priority=None, invite=guest, expires=2_000_000_000))

    pem = ("RSA PRIVATE KEY", "OPENSSH PRIVATE KEY", "EC PRIVATE KEY", "PRIVATE KEY", "DSA PRIVATE KEY")
    makers = {
        "aws_access_key_id": ("AWS Access Key", lambda: rnd.choice(["AKIA", "ASIA"]) + s(UPNUM, 16)),
        "aws_secret_quoted": ("AWS Access Key", lambda: f'aws_secret_access_key = "{s(B64, 40)}"'),
        "github": ("GitHub Token", lambda: rnd.choice(["ghp", "gho", "ghu", "ghs", "ghr"]) + "_" + s(ALNUM, 36)),
        "gitlab": ("GitLab Token", lambda: "glpat-" + s(B64URL, 20)),
        "openai": ("OpenAI Token", lambda: "sk-proj-" + s(ALNUM, 20) + "T3BlbkFJ" + s(ALNUM, 20)),
        "stripe": ("Stripe Access Key", lambda: rnd.choice(["sk", "rk"]) + "_live_" + s(ALNUM, 24)),
        "slack_token": ("Slack Token", lambda: f"xox{rnd.choice('bpa')}-{s(string.digits, 11)}-"
                                               f"{s(string.digits, 12)}-{s(LOWNUM, 24)}"),
        "slack_webhook": ("Slack Token", lambda: f"https://hooks.slack.com/services/T{s(UPNUM, 8)}/"
                                                 f"B{s(UPNUM, 10)}/{s(ALNUM, 24)}"),
        "pem_private_key": ("Private Key", lambda: f"-----BEGIN {rnd.choice(pem)}-----\n{s(B64, 64)}"),
        "jwt": ("JSON Web Token", jwt),
        "basic_auth_url": ("Basic Auth Credentials",
                           lambda: f"{rnd.choice(['https', 'postgres', 'redis', 'amqp'])}://"
                                   f"{s(string.ascii_lowercase, 6)}:{s(ALNUM, 12)}@db{rnd.randint(1, 9)}.example.com/x"),
        "twilio": ("Twilio API Key", lambda: rnd.choice(["SK", "AC"]) + s(LOWNUM, 32)),
        "sendgrid": ("SendGrid API Key", lambda: "SG." + s(B64URL, 22) + "." + s(B64URL, 43)),
        "mailchimp": ("Mailchimp Access Key", lambda: s(HEX, 32) + "-us" + str(rnd.randint(1, 20))),
        "npm": ("NPM tokens", lambda: "//registry.npmjs.org/:_authToken=npm_" + s(ALNUM, 36)),
        "pypi": ("PyPI Token", lambda: "pypi-AgEIcHlwaS5vcmc" + s(B64URL, 150)),
        "azure_storage": ("Azure Storage Account access key",
                          lambda: f"DefaultEndpointsProtocol=https;AccountName=acct{rnd.randint(1, 99)};"
                                  f"AccountKey={s(B64, 86)}==;EndpointSuffix=core.windows.net"),
        "artifactory": ("Artifactory Credentials", lambda: "AKCp" + s(ALNUM, 69)),
        "ibm_cloud_iam": ("IBM Cloud IAM Key", lambda: f"ibm_cloud_iam_api_key = {s(B64URL, 44)}"),
        "square_oauth": ("Square OAuth Secret", lambda: "sq0csp-" + s(B64URL, 43)),
        "discord": ("Discord Bot Token", lambda: rnd.choice("MNO") + s(B64URL, 23) + "." + s(B64URL, 6) + "."
                                                  + s(B64URL, 27)),
        "telegram": ("Telegram Bot Token", lambda: f"{rnd.randint(10**8, 10**9 - 1)}:{s(B64URL, 35)}"),
        "cloudant": ("Cloudant Credentials", lambda: f"cloudant_password = {s(HEX, 64)}"),
        "softlayer": ("SoftLayer Credentials", lambda: f"softlayer_api_key = {s(LOWNUM, 64)}"),
        "ibm_cos_hmac": ("IBM COS HMAC Credentials", lambda: f"ibm_cos_hmac_secret_access_key = {s(HEX, 48)}"),
        "memmesh_private_key": ("memmesh Private Key", lambda: "ed25519-private:" + b64url(rnd.randbytes(32))),
        "memmesh_invite_ticket": ("memmesh Invite Secret", invite),
        "keyword_password": ("Secret Keyword",
                             lambda: rnd.choice(["password: {}", "DB_PASSWORD={}", "api_key = {}", "wifi passwd: {}",
                                                 "secret := {}", 'PASSWORD = "{}"']).format(password())),
    }
    out: dict[str, list[tuple[str, str]]] = {}
    for name, (kind, make) in makers.items():
        out[name] = [(kind, rnd.choice(SENTENCES).format(make())) for _ in range(n)]
    return out


def identifiers(rnd: random.Random, n: int) -> dict[str, list[str]]:
    """Text that memories quote all the time and that must never be flagged."""

    def s(alphabet: str, k: int) -> str:
        return "".join(rnd.choice(alphabet) for _ in range(k))

    def ticket() -> str:
        issuer, guest = SigningKey.from_seed(rnd.randbytes(32)), SigningKey.from_seed(rnd.randbytes(32))
        return encode(issue(issuer=issuer, db="sha256:" + s(HEX, 64), addresses=["http:192.168.1.20:7000"],
                            perm="write", priority=1, recipient=guest.public, expires=2_000_000_000))

    words = ["notes", "release", "design", "api", "v2", "docs", "issues", "memory", "sync"]
    makers = {
        "entry_id_sha256": lambda: "sha256:" + s(HEX, 64),
        "git_commit": lambda: rnd.choice([s(HEX, 40), s(HEX, 12), s(HEX, 7)]),
        "uuid": lambda: str(uuid.UUID(int=rnd.getrandbits(128))),
        "uuid_upper": lambda: str(uuid.UUID(int=rnd.getrandbits(128))).upper(),
        "public_key": lambda: str(SigningKey.from_seed(rnd.randbytes(32)).public),
        "ticket_without_secret": ticket,
        "url": lambda: rnd.choice([
            f"https://github.com/{rnd.choice(words)}/{rnd.choice(words)}/commit/{s(HEX, 40)}",
            f"https://www.youtube.com/watch?v={s(B64URL, 11)}",
            f"https://docs.google.com/document/d/{s(B64URL, 44)}/edit",
            f"https://example.com/{'/'.join(rnd.choice(words) for _ in range(6))}?page={rnd.randint(1, 99)}",
            f"ssh://git@github.com/{rnd.choice(words)}/{rnd.choice(words)}.git",
            f"http://user@{rnd.choice(words)}.example.org:8080/",
        ]),
        "sha256_sum_line": lambda: f"{s(HEX, 64)}  memmesh-0.1.0.tar.gz",
    }
    return {name: [rnd.choice(SENTENCES).format(make()) for _ in range(n)] for name, make in makers.items()}


def crafted() -> dict[str, str]:
    """64 KiB texts that hold no credential: the slowest found for the library's expressions
    (several are quadratic or cubic on such text), a long line and many short ones each, and
    two realistic big values."""
    n = secrets.MAX_CHARS
    run = " key " + "A" * 24  # makes every plugin that needs a run and a keyword run

    def fill(unit: str) -> str:
        return (unit * (n // len(unit) + 1))[:n]

    def per_window(unit: str) -> str:
        return fill((unit * (1000 // len(unit) + 1))[:1000] + run)

    return {
        "npm_prefix_and_slashes": fill("/:_authToken=" + "/" * 2000 + "\n"),
        "npm_one_line": fill("/:_authToken=" + "/" * 1000),
        "openai_prefixes": per_window("sk-a") + "T3BlbkFJ",
        "jwt_prefix_runs": fill("eyJa"),
        "jwt_shaped_tokens": per_window("eyJa."),
        "keywords_without_values": per_window("password: x "),
        "spaces_after_keyword": per_window("key" + " " * 400 + "x"),
        "brackets": per_window("["),
        "quotes": per_window("\"'"),
        "short_lines_eyJ": fill("eyJ\n"),
        "short_lines_run": fill("A" * 24 + "\n"),
        "hash_list": fill("sha256:" + "0123456789abcdef" * 4 + "\n"),
        "base64_blob": "".join(random.Random(1).choice(B64) for _ in range(n)),
        "env_file_without_secrets": fill("SERVICE_KEY_NAME=plain_value\nDB_PASSWORD_FILE=/run/secrets/db\n"),
    }


def entropy_flags(plugin, text: str) -> bool:
    """detect-secrets' high-entropy test as its ad-hoc scan applies it, with the limit."""
    with plugin.non_quoted_string_regex(is_exact_match=False):
        return any(plugin.calculate_shannon_entropy(t) > plugin.entropy_limit
                   for line in text.splitlines() for t in plugin.analyze_string(line))


def keyword_raw(text: str) -> bool:
    from detect_secrets.plugins import keyword as kw

    exprs = (kw.FOLLOWED_BY_COLON_EQUAL_SIGNS_REGEX, kw.FOLLOWED_BY_COLON_REGEX, kw.FOLLOWED_BY_EQUAL_SIGNS_REGEX)
    return any(e.search(line) for line in text.splitlines() for e in exprs)


def per_us(fn, texts: list[str]) -> tuple[list, float]:
    t0 = time.perf_counter_ns()
    out = [fn(t) for t in texts]
    return out, (time.perf_counter_ns() - t0) / max(1, len(texts)) / 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, default=Path(__file__).resolve().parent / "results" / "credentials.json",
                    help="write the results here")
    ap.add_argument("--per-format", type=int, default=200, help="synthetic credentials per format")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--show", type=int, default=0, help="print N false flags and N misses")
    args = ap.parse_args()

    from detect_secrets.core.scan import scan_line
    from detect_secrets.plugins.high_entropy_strings import Base64HighEntropyString, HexHighEntropyString
    from detect_secrets.settings import default_settings

    chat = load_chat()
    rnd = random.Random(args.seed)
    creds = credentials(rnd, args.per_format)
    ids = identifiers(rnd, args.per_format)
    secrets.find_secret("warm-up: password: x1y2z3w4")  # imports detect-secrets once

    result: dict = {"date": datetime.now(UTC).strftime("%Y-%m-%d"), "machine": machine_line(),
                    "library": f"detect-secrets {__import__('detect_secrets.__version__').__version__.VERSION}",
                    "chat_source": "chitchat-dataset (MIT), every non-blank message",
                    "per_format": args.per_format, "seed": args.seed,
                    "bounds": {"max_chars": secrets.MAX_CHARS, "window": secrets.WINDOW, "step": secrets.STEP}}

    hits, us_chat = per_us(secrets.find_secret, chat)
    passed = sum(secrets._may_hold(t[:secrets.MAX_CHARS]) for t in chat)
    false = [(t, h) for t, h in zip(chat, hits) if h is not None]
    per_type: dict[str, int] = {}
    for _, h in false:
        per_type[h] = per_type.get(h, 0) + 1
    result["chat"] = {"n": len(chat), "flagged": len(false), "rate": len(false) / len(chat),
                      "per_type": per_type, "prefilter_pass": passed, "prefilter_pass_rate": passed / len(chat),
                      "us_per_turn": us_chat}

    result["credentials"] = {}
    misses = []
    all_cred_texts = []
    for name, pairs in creds.items():
        texts = [t for _, t in pairs]
        all_cred_texts += texts
        got, us = per_us(secrets.find_secret, texts)
        found = sum(g is not None for g in got)
        right = sum(g == k for (k, _), g in zip(pairs, got))
        misses += [(name, t, g) for (k, t), g in zip(pairs, got) if g != k]
        result["credentials"][name] = {"type": pairs[0][0], "n": len(texts), "found": found,
                                       "found_as_type": right, "us_per_text": us}
    n_cred = sum(v["n"] for v in result["credentials"].values())
    result["credentials_total"] = {
        "n": n_cred, "found": sum(v["found"] for v in result["credentials"].values()),
        "found_as_type": sum(v["found_as_type"] for v in result["credentials"].values()),
        "us_per_text": per_us(secrets.find_secret, all_cred_texts)[1]}

    result["identifiers"] = {}
    all_ids = []
    for name, texts in ids.items():
        all_ids += texts
        got = [secrets.find_secret(t) for t in texts]
        result["identifiers"][name] = {"n": len(texts), "flagged": sum(g is not None for g in got)}
        if args.show:
            for t, g in [(t, g) for t, g in zip(texts, got) if g][:args.show]:
                print("ID FLAGGED", g, repr(t[:160]))

    everything = chat + all_cred_texts + all_ids
    result["prefilter_disagreements"] = sum(
        secrets.find_secret(t) != find_secret_unfiltered(t) for t in everything)

    result["crafted_64k"] = {}
    for name, text in crafted().items():
        t0 = time.perf_counter()
        found = secrets.find_secret(text)
        result["crafted_64k"][name] = {"ms": (time.perf_counter() - t0) * 1000, "found": found}

    # The plugins left out, on the same texts.
    b64, hexp = Base64HighEntropyString(), HexHighEntropyString()
    left_out: dict = {}
    for label, fn in (("base64_high_entropy_4.5", lambda t: entropy_flags(b64, t)),
                      ("hex_high_entropy_3.0", lambda t: entropy_flags(hexp, t)),
                      ("keyword_raw_expressions", keyword_raw)):
        row = {"chat_flagged": sum(fn(t) for t in chat)}
        row["identifiers_flagged"] = {name: sum(fn(t) for t in texts) for name, texts in ids.items()}
        row["credentials_found"] = sum(fn(t) for t in all_cred_texts)
        left_out[label] = row
    sample = chat[:SCAN_LINE_SAMPLE]
    with default_settings() as settings:
        assert not any("verification" in f for f in settings.filters), "verification must stay off"
        t0 = time.perf_counter()
        any_result = sum(any(True for line in t.splitlines() for _ in scan_line(line)) for t in sample)
        ms = (time.perf_counter() - t0) * 1000 / sum(len(t.splitlines()) for t in sample)
    left_out["scan_line_all_plugins"] = {"sample": len(sample), "with_any_result": any_result, "ms_per_line": ms}
    result["left_out"] = left_out

    ch, tot = result["chat"], result["credentials_total"]
    result["target_met"] = (ch["rate"] <= 0.001 and result["prefilter_disagreements"] == 0
                            and all(v["flagged"] == 0 for v in result["identifiers"].values())
                            and tot["found_as_type"] == tot["n"])

    print(f"memmesh secrets benchmark  {result['date']}  {result['machine']}  {result['library']}")
    print(f"{'credential format':24} {'plugin':34} {'n':>5} {'found':>6} {'as type':>8} {'us/text':>8}")
    for name, v in result["credentials"].items():
        print(f"{name:24} {v['type']:34} {v['n']:>5} {v['found']:>6} {v['found_as_type']:>8} {v['us_per_text']:>8.1f}")
    print(f"{'all credentials':59} {tot['n']:>5} {tot['found']:>6} {tot['found_as_type']:>8} {tot['us_per_text']:>8.1f}")
    print()
    print(f"{'must not be flagged':24} {'n':>6} {'flagged':>8}")
    for name, v in result["identifiers"].items():
        print(f"{name:24} {v['n']:>6} {v['flagged']:>8}")
    print(f"{'chat turns (chitchat)':24} {ch['n']:>6} {ch['flagged']:>8}  ({ch['rate'] * 100:.4f} %, "
          f"{ch['us_per_turn']:.1f} us/turn, pre-filter passes {ch['prefilter_pass_rate'] * 100:.2f} %) {ch['per_type']}")
    print(f"pre-filter disagreements: {result['prefilter_disagreements']}")
    print("64 KiB inputs (ms): " + ", ".join(f"{k} {v['ms']:.0f}" + (f" [{v['found']}]" if v["found"] else "")
                                            for k, v in result["crafted_64k"].items()))
    print()
    print(f"{'left out':28} {'chat flagged':>12} {'credentials found':>18}  identifiers flagged")
    for label in ("base64_high_entropy_4.5", "hex_high_entropy_3.0", "keyword_raw_expressions"):
        row = left_out[label]
        flagged_ids = {k: v for k, v in row["identifiers_flagged"].items() if v}
        print(f"{label:28} {row['chat_flagged']:>12} {row['credentials_found']:>18}  {flagged_ids}")
    sl = left_out["scan_line_all_plugins"]
    print(f"detect-secrets scan_line, every plugin: {sl['with_any_result']}/{sl['sample']} chat turns with a "
          f"result, {sl['ms_per_line']:.2f} ms per line")
    print(f"target (<= 0.1 % chat flagged, no identifier flagged, every credential found as its type, "
          f"no disagreement): {'met' if result['target_met'] else 'NOT met'}")
    if args.show:
        for t, h in false[:args.show]:
            print("FALSE", h, repr(t[:200]))
        for name, t, g in misses[:args.show]:
            print("MISS", name, g, repr(t[:200]))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
