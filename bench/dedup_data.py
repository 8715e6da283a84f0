"""Generated memories that calibrate and measure the near-duplicate threshold (bench/dedup.py).

Each topic gives, from templates whose slots (names, days, numbers, places) are drawn with a
seeded random generator:

* a **base** fact and two **paraphrases**: the same fact in other words, under other keys
  (what an agent writes when it forgets it already saved a fact): every pair of the three is a
  duplicate pair;
* two **other facts on the same topic** (same people, same system, another attribute): paired
  with the base, the paraphrases and each other, they are pairs that must not be called
  duplicates;
* an **update**: the base's attribute with another value (the deploy day moved). Not used for
  the fit; reported apart (such a pair is where ``supersede`` is the right choice).

Keys follow the habits of agents: dotted, dashed or underscored, sometimes English words.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from itertools import combinations

NAMES = ["Alice", "Bruno", "Carmen", "Deepak", "Elena", "Farid", "Greta", "Hugo", "Isla", "Jun", "Kofi", "Lena",
         "Marta", "Nils", "Omar", "Priya"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October"]
CITIES = ["Lisbon", "Berlin", "Toronto", "Osaka", "Nairobi", "Madrid", "Oslo", "Austin", "Dublin", "Prague"]
LANGS = ["Python", "Go", "Rust", "TypeScript", "Kotlin"]
DBS = ["PostgreSQL", "MySQL", "SQLite", "MongoDB"]
CLOUDS = ["AWS", "GCP", "Azure", "Hetzner"]
FOODS = ["mushrooms", "coriander", "olives", "blue cheese", "shellfish", "peanuts"]
DRINKS = ["green tea", "black coffee", "oat latte", "sparkling water"]
EDITORS = ["Vim", "VS Code", "Emacs", "IntelliJ"]
TOOLS = ["Jira", "Linear", "GitHub Issues", "Trello"]

# (slots, base, paraphrases, other facts on the topic, update); each text is "key | value".
# Slots: {name}/{name2} people, {day}/{day2}, {month}, {city}/{city2}, {n}/{m} numbers,
# {lang}, {db}, {cloud}, {food}, {drink}, {editor}, {tool}; the update redraws {x2} slots.
TOPICS: list[tuple[str, list[str], list[str], str]] = [
    ("deploy.day | we deploy to production every {day}",
     ["release-schedule | production releases go out on {day}s", "ship_day | {day} is our weekly release day"],
     ["deploy.freeze | no deploys to production after {day2} noon",
      "deploy.approver | {name} must approve every production deploy"],
     "deploy.day | we deploy to production every {day2}"),
    ("db.primary | the main database is {db}",
     ["storage.engine | we keep our data in {db}", "primary-datastore | our primary datastore runs on {db}"],
     ["db.backups | database backups run nightly at {n}:00",
      "db.owner | {name} is the owner of the database schema"],
     "db.primary | the main database is {db2}"),
    ("lang.backend | the backend is written in {lang}",
     ["backend-language | our server code is {lang}", "stack.server | we use {lang} for the backend services"],
     ["lang.frontend | the web frontend uses {lang2} with React",
      "lang.style | backend code style is checked by a linter in CI"],
     "lang.backend | the backend is written in {lang2}"),
    ("cloud.provider | we host everything on {cloud}",
     ["hosting | all our infrastructure runs in {cloud}", "infra.cloud | {cloud} is the cloud we deploy to"],
     ["cloud.budget | the monthly cloud budget is {n}000 dollars",
      "cloud.region | the servers are in the {city} region"],
     "cloud.provider | we host everything on {cloud2}"),
    ("oncall.lead | {name} leads the on-call rotation",
     ["rotation-owner | the on-call schedule is run by {name}", "oncall_manager | {name} manages who is on call"],
     ["oncall.length | an on-call shift lasts {n} days",
      "oncall.pager | pages go to the on-call phone through the alerting tool"],
     "oncall.lead | {name2} leads the on-call rotation"),
    ("standup.time | daily standup is at {n}:30",
     ["meeting.standup | the team standup happens every day at {n}:30",
      "daily-sync | we meet for the daily sync at half past {n}"],
     ["standup.room | standup is in the {city} meeting room",
      "retro.day | the sprint retrospective is on {day}"],
     "standup.time | daily standup is at {m}:30"),
    ("user.coffee | the user drinks {drink} in the morning",
     ["preference.morning-drink | every morning they have {drink}", "likes.drink | their morning drink of choice is {drink}"],
     ["user.lunch | the user eats lunch at {n}:00",
      "user.sugar | the user takes no sugar in anything"],
     "user.coffee | the user drinks {drink2} in the morning"),
    ("diet.avoid | the user dislikes {food}, leave it out of recipes",
     ["food-dislike | never cook with {food}, the user hates it", "recipes.exclude | don't put {food} in the user's meals"],
     ["diet.vegetarian | the user eats fish but no meat",
      "diet.spicy | the user likes very spicy dishes"],
     "diet.avoid | the user dislikes {food2}, leave it out of recipes"),
    ("user.city | the user lives in {city}",
     ["home-town | their home is in {city}", "location.home | the user's place of residence is {city}"],
     ["user.office | the user works from an office in {city2}",
      "user.commute | the user commutes by bike"],
     "user.city | the user lives in {city2}"),
    ("editor | the user codes in {editor}",
     ["tools.editor | their editor of choice is {editor}", "ide-preference | the user prefers {editor} for programming"],
     ["editor.theme | the user wants a dark theme everywhere",
      "editor.font | the user's code font size is {n} points"],
     "editor | the user codes in {editor2}"),
    ("tracker | tasks are tracked in {tool}",
     ["issue-tracker | we file our tickets in {tool}", "project.tasks | the team manages work items in {tool}"],
     ["tracker.triage | tickets are triaged every {day}",
      "tracker.labels | bug tickets need a severity label"],
     "tracker | tasks are tracked in {tool2}"),
    ("birthday.sister | my sister {name}'s birthday is on {month} {n}",
     ["family.sister-bday | {name}, my sister, was born on {month} {n}",
      "dates.sister | remember {name}'s birthday, {month} {n}, she is my sister"],
     ["family.sister-city | my sister {name} lives in {city}",
      "family.sister-job | my sister {name} works as a nurse"],
     "birthday.sister | my sister {name}'s birthday is on {month2} {n}"),
    ("pet.dog | our dog {name} eats twice a day",
     ["dog-feeding | {name} the dog gets fed two times daily", "pets.meals | feed the dog {name} morning and evening"],
     ["pet.vet | {name} the dog sees the vet every spring",
      "pet.walks | the dog {name} needs a long walk after dinner"],
     "pet.dog | our dog {name} eats three times a day"),
    ("api.rate-limit | the public API allows {n}00 requests per minute",
     ["limits.api | clients may call the public API {n}00 times a minute",
      "throttle | API throttling kicks in above {n}00 calls per minute"],
     ["api.auth | the public API uses bearer tokens for authentication",
      "api.version | the public API is at version {m}"],
     "api.rate-limit | the public API allows {m}00 requests per minute"),
    ("ci.timeout | CI jobs time out after {n} minutes",
     ["pipeline.limit | a CI run is killed when it exceeds {n} minutes",
      "build-timeout | builds in continuous integration stop after {n} minutes"],
     ["ci.runner | CI runs on self-hosted runners",
      "ci.cache | CI caches dependencies between runs"],
     "ci.timeout | CI jobs time out after {m} minutes"),
    ("review.rule | every pull request needs two approvals",
     ["pr-policy | a PR can only merge once two reviewers approve it",
      "code-review.approvals | two approving reviews are required before merging"],
     ["review.owner | {name} reviews all database migrations",
      "review.size | pull requests should stay under {n}00 lines"],
     "review.rule | every pull request needs one approval"),
    ("meeting.planning | sprint planning is every other {day} morning",
     ["sprint-planning | we plan the sprint on {day} mornings, every two weeks",
      "cadence.planning | planning happens biweekly on {day} before lunch"],
     ["sprint.length | a sprint lasts two weeks",
      "meeting.demo | the sprint demo is on {day2} afternoon"],
     "meeting.planning | sprint planning is every other {day2} morning"),
    ("manager | {name} is my manager",
     ["org.boss | I report to {name}", "team.lead | my direct manager is {name}"],
     ["manager.1on1 | my one-on-one with {name} is on {day}",
      "org.skip | {name2} is my manager's manager"],
     "manager | {name2} is my manager"),
    ("travel.conference | the user flies to {city} for the conference in {month}",
     ["trip.conf | in {month} they travel to {city} for a conference",
      "calendar.trip | conference trip: {city}, {month}"],
     ["travel.hotel | the conference hotel is booked near the station",
      "travel.talk | the user gives a talk on the second day of the conference"],
     "travel.conference | the user flies to {city2} for the conference in {month}"),
    ("secret.rotation | API keys are rotated every {n} days",
     ["keys.rotate | we rotate our API keys each {n} days", "security.key-rotation | key rotation period: {n} days"],
     ["security.mfa | every engineer must use two-factor authentication",
      "security.audit | the security audit is in {month}"],
     "secret.rotation | API keys are rotated every {m} days"),
    ("language.user | the user prefers answers in Portuguese",
     ["reply-language | answer the user in Portuguese", "prefs.lang | they want replies written in Portuguese"],
     ["prefs.length | the user prefers short answers",
      "prefs.units | the user uses metric units"],
     "language.user | the user prefers answers in Spanish"),
    ("car.service | the car is due for its service in {month}",
     ["vehicle.maintenance | the car needs servicing in {month}",
      "auto-service-date | book the car's annual service for {month}"],
     ["car.insurance | the car insurance renews in {month2}",
      "car.tyres | the car has winter tyres in the garage"],
     "car.service | the car is due for its service in {month2}"),
    ("gym | the user goes to the gym on {day}s and {day2}s",
     ["fitness.schedule | gym days are {day} and {day2}", "workout-days | they work out every {day} and {day2}"],
     ["fitness.goal | the user is training for a 10k run",
      "fitness.injury | the user has a sore left knee"],
     "gym | the user goes to the gym on {day}s only"),
    ("backup.location | backups are stored in a bucket in {city}",
     ["storage.backups | our backup copies live in the {city} bucket",
      "dr.backups | the disaster recovery backups sit in {city}"],
     ["backup.retention | backups are kept for {n} days",
      "backup.test | we test restoring a backup every quarter"],
     "backup.location | backups are stored in a bucket in {city2}"),
    ("wifi.password-hint | the wifi password is on the back of the router",
     ["network.home | the home wifi password is written under the router",
      "router-note | look at the router's back for the wifi password"],
     ["network.router | the router is in the hallway cupboard",
      "network.speed | the home internet is {n}00 megabits"],
     "wifi.password-hint | the wifi password is in the kitchen drawer"),
    ("payday | salaries are paid on the {n}th of each month",
     ["finance.salary | we get paid on the {n}th every month", "pay-date | monthly pay arrives on the {n}th"],
     ["finance.expenses | expense reports are due at month end",
      "finance.bonus | the yearly bonus is paid in {month}"],
     "payday | salaries are paid on the {m}th of each month"),
    ("release.version | the next release is version {n}.{m}",
     ["roadmap.next | version {n}.{m} is the upcoming release", "upcoming-version | we are about to ship {n}.{m}"],
     ["release.notes | release notes are written by {name}",
      "release.branch | releases are cut from the main branch"],
     "release.version | the next release is version {n}.{m2}"),
    ("tests.framework | the tests use pytest",
     ["testing.tool | our test suite runs on pytest", "qa.framework | pytest is the test runner we use"],
     ["tests.coverage | test coverage must stay above {n}0 percent",
      "tests.slow | slow tests are marked and skipped locally"],
     "tests.framework | the tests use unittest"),
    ("allergy | the user is allergic to {food}",
     ["health.allergy | they have an allergy to {food}", "medical.allergies | {food} causes an allergic reaction"],
     ["health.doctor | the user's doctor is Dr {name}",
      "health.medication | the user takes vitamin D in winter"],
     "allergy | the user is allergic to {food2}"),
    ("timezone | the user is in the {city} time zone",
     ["user.tz | schedule meetings in {city} time for the user", "tz-pref | the user's clock follows {city}"],
     ["user.hours | the user works from {n} in the morning",
      "user.nodisturb | no messages to the user after 8 pm"],
     "timezone | the user is in the {city2} time zone"),
]

# Held out: written after the threshold was fitted, never used to fit it; measured once with the
# thresholds as they stand (bench/dedup.py reports it apart).
HELD_OUT: list[tuple[str, list[str], list[str], str]] = [
    ("monitoring | alerts are sent to the {tool} channel",
     ["alerts.destination | our alerting posts into the {tool} channel",
      "paging-target | monitoring notifications land in {tool}"],
     ["monitoring.dashboards | the latency dashboards live in Grafana",
      "monitoring.threshold | an alert fires when errors exceed {n} percent"],
     "monitoring | alerts are sent to the {tool2} channel"),
    ("user.kids | the user has two children, {name} and {name2}",
     ["family.children | their kids are called {name} and {name2}",
      "household.kids | {name} and {name2} are the user's two children"],
     ["family.school | the children go to the school on Elm Road",
      "family.pickup | the user picks the kids up at {n}:00 on {day}s"],
     "user.kids | the user has three children"),
    ("vacation | the user is on holiday for the whole of {month}",
     ["leave.dates | they are away on vacation all of {month}",
      "ooo.period | the user is out of office throughout {month}"],
     ["leave.cover | {name} covers the user's work during holidays",
      "leave.days | the user has {n} days of leave left this year"],
     "vacation | the user is on holiday for the whole of {month2}"),
    ("laptop | the user works on a {n}-inch laptop running Linux",
     ["hardware.machine | their work computer is a Linux laptop with a {n} inch screen",
      "setup.computer | the user's machine: a {n} inch notebook on Linux"],
     ["hardware.monitor | the user has a second monitor at home",
      "hardware.keyboard | the user types on a split keyboard"],
     "laptop | the user works on a {m}-inch laptop running Linux"),
    ("docs.location | the team documentation is in the wiki under Engineering",
     ["wiki.engineering | our engineering docs live on the wiki's Engineering pages",
      "knowledge-base | look in the wiki's Engineering section for team documentation"],
     ["docs.owner | {name} keeps the onboarding guide up to date",
      "docs.review | design documents are reviewed on {day}s"],
     "docs.location | the team documentation is in the shared drive"),
    ("parking | the user parks on level {n} of the office garage",
     ["car.parking-spot | their parking space is on floor {n} of the garage",
      "office.parking | the user's car goes on garage level {n}"],
     ["office.entrance | the office entrance badge works from 7 am",
      "office.desk | the user sits at desk {m}{n} near the window"],
     "parking | the user parks on level {m} of the office garage"),
]


@dataclass(frozen=True)
class Memory:
    key: str
    value: str

    @property
    def text(self) -> str:
        return f"{self.key} {self.value}"  # what remember embeds


@dataclass(frozen=True)
class Pair:
    a: Memory
    b: Memory
    kind: str  # "duplicate", "different" (same topic), "update"
    topic: int


def _slots(rnd: random.Random) -> dict[str, str]:
    name, name2 = rnd.sample(NAMES, 2)
    day, day2 = rnd.sample(DAYS, 2)
    month, month2 = rnd.sample(MONTHS, 2)
    city, city2 = rnd.sample(CITIES, 2)
    lang, lang2 = rnd.sample(LANGS, 2)
    db, db2 = rnd.sample(DBS, 2)
    cloud, cloud2 = rnd.sample(CLOUDS, 2)
    food, food2 = rnd.sample(FOODS, 2)
    drink, drink2 = rnd.sample(DRINKS, 2)
    editor, editor2 = rnd.sample(EDITORS, 2)
    tool, tool2 = rnd.sample(TOOLS, 2)
    n, m = rnd.sample(range(2, 10), 2)
    m2 = (m + 1) % 10
    return {k: str(v) for k, v in locals().items() if k != "rnd"}


def _memory(template: str, slots: dict[str, str]) -> Memory:
    key, value = (s.strip() for s in template.format(**slots).split("|", 1))
    return Memory(key, value)


def pairs(seed: int = 7, *, held_out: bool = False) -> list[Pair]:
    """Every pair of every topic (docstring of the module), slots drawn with ``seed``;
    ``held_out``: of the held-out topics instead (never used to fit)."""
    rnd = random.Random(seed)
    out: list[Pair] = []
    for t, (base, paras, others, update) in enumerate(HELD_OUT if held_out else TOPICS):
        slots = _slots(rnd)
        same = [_memory(x, slots) for x in [base, *paras]]
        diff = [_memory(x, slots) for x in others]
        out += [Pair(a, b, "duplicate", t) for a, b in combinations(same, 2)]
        out += [Pair(a, b, "different", t) for a in same for b in diff]
        out += [Pair(diff[0], diff[1], "different", t)]
        out.append(Pair(same[0], _memory(update, slots), "update", t))
    return out
