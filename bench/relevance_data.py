"""Generated text for bench/relevance.py: a team's working memory, questions about it, and
messages from other domains that share no topic with it.

Everything is built from templates with a seeded random choice of the fillers, so a run is
reproducible and nothing here was chosen by looking at what recall returns. The stored
memories are about one domain (a small software team: services, deploys, on-call, deadlines,
owners, data stores, alerts, meetings); the on-topic questions ask for one stored fact each,
worded differently from the memory; the off-topic messages come from other domains (cooking,
travel, sport, geography, films, health, small talk) and are what an agent also hears.

The relevance floor of an embedder is calibrated on different data (node/memory/, its own
generator); this set is for evaluation only.
"""
from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

SERVICES = ["billing-api", "auth-gateway", "search-indexer", "payments-worker", "email-relay", "image-resizer",
            "report-builder", "audit-log", "feature-flags", "geo-lookup", "invoice-renderer", "session-store",
            "webhook-dispatcher", "metrics-collector", "ledger-sync", "pdf-exporter", "rate-limiter",
            "catalog-service", "inventory-sync", "notification-hub"]
PEOPLE = ["Priya", "Marek", "Aiko", "Tomás", "Ngozi", "Lars", "Fatima", "Dmitri", "Chen", "Olusegun", "Ines",
          "Rafael", "Hana", "Kwame", "Sofia", "Jonas"]
TOOLS = ["Argo CD", "Jenkins", "Helm", "Terraform", "Spinnaker", "GitHub Actions", "Nomad", "Ansible"]
STORES = ["PostgreSQL", "Redis", "Cassandra", "MySQL", "DynamoDB", "ClickHouse", "MongoDB", "SQLite"]
PROJECTS = ["Atlas migration", "checkout redesign", "SSO rollout", "search relevance sprint", "GDPR export",
            "mobile offline mode", "billing v2", "observability revamp", "tenant isolation", "API deprecation"]
TEAMS = ["platform", "payments", "growth", "infra", "mobile", "data", "security", "support tooling"]
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"]
MONTHS = ["March", "April", "May", "June", "September", "October", "November"]
PAGERS = ["PagerDuty", "Opsgenie", "the #incidents channel"]
BRANCHES = ["main", "release", "stable"]


@dataclass(frozen=True)
class Fact:
    key: str
    value: str
    questions: tuple[str, ...]  # each asks for this fact and for no other stored one


def _facts_for(svc: str, rnd: random.Random) -> list[Fact]:
    who = rnd.choice(PEOPLE)
    tool, store = rnd.choice(TOOLS), rnd.choice(STORES)
    ms, days = rnd.choice([150, 200, 300, 500, 800]), rnd.choice([30, 60, 90])
    return [
        Fact(f"deploy-{svc}", f"{svc} is deployed with {tool} from the {rnd.choice(BRANCHES)} branch once the smoke "
                              "tests pass", (f"how do we deploy {svc}?", f"what's the release procedure for {svc}")),
        Fact(f"oncall-{svc}", f"{who} is on call for {svc} this week; page through {rnd.choice(PAGERS)}",
             (f"who is on call for {svc}?", f"who should I page if {svc} breaks")),
        Fact(f"owner-{svc}", f"{rnd.choice(PEOPLE)} owns the {svc} codebase and reviews its pull requests",
             (f"who owns {svc}?", f"who reviews changes to {svc}")),
        Fact(f"datastore-{svc}", f"{svc} keeps its data in {store} with nightly backups to object storage",
             (f"where does {svc} keep its data?", f"which database backs {svc}")),
        Fact(f"rotation-{svc}", f"the {svc} credentials are rotated every {days} days by {who}",
             (f"how often are the {svc} credentials rotated?", f"when do {svc} secrets get rotated")),
        Fact(f"alert-{svc}", f"an alert fires when {svc} latency exceeds {ms} ms at p99",
             (f"what is the latency alert threshold for {svc}?", f"when does {svc} alert on latency")),
    ]


def memories(rnd: random.Random) -> list[Fact]:
    facts = [f for svc in SERVICES for f in _facts_for(svc, rnd)]
    for project in PROJECTS:
        day = f"{rnd.choice(MONTHS)} {rnd.randint(1, 28)}"
        slug = project.replace(" ", "-").lower()
        facts.append(Fact(f"deadline-{slug}", f"the {project} milestone is due on {day}",
                          (f"when is the {project} due?", f"what's the deadline for the {project}")))
    for team in TEAMS:
        slug = team.replace(" ", "-")
        facts.append(Fact(f"standup-{slug}", f"the {team} team holds its standup at "
                                             f"{rnd.choice(['9:30', '10:00', '10:15', '11:00'])} on "
                                             f"{rnd.choice(WEEKDAYS)}s and {rnd.choice(WEEKDAYS)}s",
                          (f"when is the {team} standup?", f"what time does the {team} team meet")))
    return facts


DISHES = ["banana bread", "risotto", "pad thai", "lentil soup", "sourdough", "paella", "tiramisu", "ramen",
          "guacamole", "shakshuka", "pancakes", "lasagna", "falafel", "apple pie", "curry"]
FOODS = ["eggs", "rice", "pasta", "potatoes", "broccoli", "quinoa", "chickpeas", "salmon"]
CITIES = ["Lisbon", "Kyoto", "Marrakesh", "Reykjavik", "Buenos Aires", "Hanoi", "Prague", "Cape Town", "Oslo",
          "Vancouver", "Istanbul", "Edinburgh"]
COUNTRIES = ["France", "Peru", "Kenya", "Vietnam", "Norway", "Chile", "Egypt", "Canada", "Portugal", "Nepal"]
SPORTS = ["football", "tennis", "cricket", "basketball", "rugby", "cycling", "chess", "volleyball"]
FILMS = ["Spirited Away", "Casablanca", "Parasite", "Amélie", "The Godfather", "Arrival", "Paddington 2"]
SEASONS = ["spring", "summer", "autumn", "winter"]
HOBBIES = ["knitting", "birdwatching", "pottery", "rock climbing", "gardening", "painting", "sailing"]
AILMENTS = ["a cold", "a sore throat", "back pain", "jet lag", "a headache", "trouble sleeping"]

OFF_TOPIC = [
    "what's a good recipe for {dish}?", "how long should I boil {food}?", "can I freeze {dish}?",
    "any tips for making {dish} at home", "is {dish} hard to cook for beginners?",
    "what is the capital of {country}?", "what language do they speak in {country}?",
    "any tips for visiting {city} in {season}?", "what should I pack for {city}?",
    "is {city} expensive for tourists?", "who won the {sport} world cup?", "how do you score in {sport}?",
    "I just watched {film}, what a film", "is {film} worth seeing?", "who directed {film}?",
    "how do I get started with {hobby}?", "I'm thinking of taking up {hobby}", "what helps with {ailment}?",
    "I've had {ailment} all day", "how was your weekend?", "thanks, that's all for now", "good morning!",
    "tell me a joke", "what's your favourite colour?", "can you recommend a novel?", "I love rainy evenings",
    "my cat keeps knocking things off the shelf", "how many planets are in the solar system?",
    "why is the sky blue?", "what's the tallest mountain in {country}?", "how far is {city} from {city2}?",
]


FILLERS = {"dish": DISHES, "food": FOODS, "country": COUNTRIES, "city": CITIES, "city2": CITIES,
           "season": SEASONS, "sport": SPORTS, "film": FILMS, "hobby": HOBBIES, "ailment": AILMENTS}


def all_off_topic() -> list[str]:
    """Every distinct message the templates make (two cities in one message differ)."""
    out: set[str] = set()
    for t in OFF_TOPIC:
        names = [n for n in FILLERS if "{" + n + "}" in t]
        for values in itertools.product(*(FILLERS[n] for n in names)):
            fill = dict(zip(names, values))
            if fill.get("city") is not None and fill.get("city") == fill.get("city2"):
                continue
            out.add(t.format(**fill))
    return sorted(out)


def off_topic(rnd: random.Random, n: int | None) -> list[str]:
    """``n`` distinct messages from other domains than the memories' (None: all of them), in a
    seeded random order; ValueError when the templates make fewer."""
    every = all_off_topic()
    rnd.shuffle(every)
    if n is not None and n > len(every):
        raise ValueError(f"the templates make {len(every)} distinct off-topic messages, not {n}")
    return every if n is None else every[:n]
