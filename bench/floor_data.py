"""Generated text that calibrates an embedder's relevance floor (bench/calibrate_floor.py).

Deliberately another world than bench/relevance_data.py, which evaluates the floor: here the
stored memories are a person's household (family, home, car, pets, health appointments, tastes)
and the unrelated messages are general questions about science, history, programming and
language, and small talk. A floor fitted here and then measured there has not seen the evaluation's domains.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

RELATIVES = ["mother", "father", "sister", "brother", "grandmother", "uncle", "aunt", "cousin", "son", "daughter"]
NAMES = ["Alice", "Bruno", "Carmen", "Deepak", "Elena", "Farid", "Greta", "Hugo", "Isla", "Jun", "Kofi", "Lena"]
APPLIANCES = ["dishwasher", "boiler", "washing machine", "fridge", "oven", "heat pump", "dryer", "vacuum robot"]
PETS = ["dog", "cat", "rabbit", "parrot", "tortoise", "hamster"]
DOCTORS = ["dentist", "optician", "GP", "physiotherapist", "dermatologist", "vet"]
FOODS = ["olives", "coriander", "mushrooms", "spicy food", "oat milk", "dark chocolate", "blue cheese", "sushi"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October"]


@dataclass(frozen=True)
class Fact:
    key: str
    value: str
    question: str


def memories(rnd: random.Random) -> list[Fact]:
    facts: list[Fact] = []
    for rel in RELATIVES:
        name = rnd.choice(NAMES)
        day = f"{rnd.choice(MONTHS)} {rnd.randint(1, 28)}"
        facts.append(Fact(f"birthday-{rel}", f"my {rel} {name}'s birthday is on {day}",
                          f"when does my {rel} celebrate turning a year older"))
    for app in APPLIANCES:
        year = rnd.randint(2015, 2024)
        facts.append(Fact(f"warranty-{app.replace(' ', '-')}", f"the {app} was bought in {year} with a five year "
                                                                "warranty, receipt in the blue folder",
                          f"is the {app} still covered if it breaks"))
    for pet in PETS:
        name = rnd.choice(NAMES)
        facts.append(Fact(f"pet-{pet}", f"our {pet} {name} eats twice a day and needs a check-up every spring",
                          f"how often should {name} the {pet} be fed"))
    facts.extend(Fact(f"appointment-{doc}", f"next {doc} appointment is {rnd.choice(MONTHS)} "
                                            f"{rnd.randint(1, 28)} at {rnd.randint(8, 17)}:00",
                      f"when am I seeing the {doc} again") for doc in DOCTORS)
    facts.extend(Fact(f"dislike-{food.replace(' ', '-')}", f"I can't stand {food}, leave it out of recipes",
                      f"should dinner include {food}") for food in FOODS)
    facts.append(Fact("car-service", "the car needs its annual service and MOT in October at the garage on Elm Road",
                      "when is the vehicle due at the mechanic"))
    facts.append(Fact("wifi-router", "the home wifi router is in the hallway cupboard; restart it by unplugging",
                      "where is the internet box at home"))
    return facts


UNRELATED = [
    "what causes the northern lights?", "how does photosynthesis work?", "when did the Roman empire fall?",
    "explain recursion in programming", "what is a closure in JavaScript?", "how do vaccines train the immune system?",
    "who wrote the theory of general relativity?", "what is the difference between TCP and UDP?",
    "why do leaves change colour in autumn?", "how are black holes formed?", "what is the Pythagorean theorem?",
    "translate 'good luck' into Spanish", "what does the French word 'boulangerie' mean?",
    "how many bones are in the human body?", "what is inflation in economics?", "who painted the Mona Lisa?",
    "what is the speed of light?", "how do I reverse a linked list?", "what is a prime number?",
    "summarise the causes of the first world war", "how do tides work?", "what is machine learning?",
    "how does a compiler differ from an interpreter?", "what year did humans land on the moon?",
    "why is the ocean salty?", "what is the largest desert on earth?", "how do bees make honey?",
    "what is the plural of cactus?", "how does compound interest work?", "what is an API?",
    "describe the water cycle", "what is quantum entanglement?", "how do earthquakes happen?",
    "who was Ada Lovelace?", "what is a haiku?", "how does GPS find my position?",
    "what's the boiling point of water at altitude?", "how do airplanes stay in the air?",
    "what is the difference between weather and climate?", "how many languages are spoken in India?",
]


CONCEPTS = ["entropy", "the Doppler effect", "plate tectonics", "natural selection", "the French revolution",
            "supply and demand", "a hash table", "binary search", "the Renaissance", "photosynthesis", "DNA replication",
            "the stock market", "a neural network", "the Silk Road", "continental drift", "the printing press",
            "a sonnet", "the greenhouse effect", "the immune system", "object-oriented programming",
            "public key cryptography", "the Big Bang", "the Magna Carta", "impressionism", "the carbon cycle",
            "a derivative in calculus", "the periodic table", "the Cold War", "a recursive function", "Bayes' theorem",
            "the Krebs cycle", "the Industrial Revolution", "string theory", "a sorting algorithm", "the Ottoman empire",
            "magnetism", "the subjunctive mood", "game theory", "the nervous system", "a black hole"]
TEMPLATES = ["what is {c}?", "explain {c} simply", "give me a short history of {c}", "why does {c} matter?",
             "can you teach me about {c}", "what are common misconceptions about {c}?"]


# What else an agent hears: small talk and passing remarks, none about the household's facts.
SMALL_TALK = [
    "I'm so tired today", "the train was late again this morning", "we went hiking on Saturday",
    "that meeting could have been an email", "I finally finished the jigsaw puzzle", "it's been raining for days",
    "what a lovely sunset", "I can't believe it's already December", "the new album is fantastic",
    "traffic was terrible on the bridge", "I started learning the guitar", "the museum was packed",
    "my flight got delayed by three hours", "I ran my first 10k", "the concert tickets sold out in minutes",
    "the crossword was hard today", "I'm thinking about a haircut",
    "the coffee shop on the corner closed", "we binge-watched a whole series", "my phone battery dies so fast",
    "I lost my umbrella again", "the bus driver was really friendly", "I'm not a morning person",
    "the queue at the post office was huge", "I tried a yoga class", "the lake froze over",
    "I found a great podcast about space", "I'm bored, entertain me",
    "good night!", "hello there", "thanks a lot", "haha that's funny", "ok, see you later", "never mind",
    "can you say that again?", "that's interesting", "I disagree with you", "let's change the subject",
    "how are you today?", "what's new?", "any plans for the weekend?", "I'm back from holiday",
    "the festival was amazing this year", "it's too hot to think", "I need a vacation", "my friend got engaged", "we're watching the match tonight",
]


def unrelated() -> list[str]:
    """Messages that share no topic with :func:`memories` (about 330): general-knowledge
    questions and small talk."""
    return list(UNRELATED) + [t.format(c=c) for c in CONCEPTS for t in TEMPLATES] + SMALL_TALK
