"""Write ``tasks.jsonl`` for the offline support-routing example.

    python -m evolution.example.generate_tasks [--output PATH]

Deterministic: one seeded ``random.Random`` drives every choice, so running it
again reproduces the file byte for byte (a test checks this). Each line is
``{"id", "instruction", "files", "expected", "criteria", "metadata"}``.

The mix is designed so that the seed harness passes roughly 35-55% of the
tasks and a well-evolved *generic* harness roughly 80-90%, never 100%:

- most tasks are plain requests for one tool, phrased either with the seed
  harness's keywords or with synonyms, with each argument written in a
  canonical or a messy format ("#a1234", "12,50 EUR", "07700 900123", ...);
- some need the public ticket file (the account or phone number "on file");
- some are long, with the useful part past the seed's context cut;
- a handful are hard: two intents in one message, two values of the same
  kind, amounts in words, relative dates, spelled-out emails. No generic
  edit fixes all of them.

Customer names, order ids and other values are random and look unique, so
that an edit copying them into the harness is easy to spot as leakage.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

SEED = 20260301
TASKS_PATH = Path(__file__).resolve().parent / "tasks.jsonl"
HEADER = "Route this customer-support message to one tool and fill in the tool's arguments."

FIRST = """Mirela Tobiah Ingeborg Caspian Oluwaseun Radomir Anouk Thandiwe Leopold Saoirse Kaito Ottoline
Bartholomew Zofia Emeric Priyanka Fenella Ignatius Marisol Dagny Casimir Yewande Alarik Perpetua Ezekiel
Ludmila Tancredi Wilhelmina Oisin Nkechi Florentyna Augustin Henrike Teodoro Solveig Evander Rosalind
Makoa Clementine Gwydion Iolanthe Bastiaan Seraphina Quillon Maelys Dashiell Ottavia Jarrah Ximena
Berengar Aurelie Kwabena Sigrun Lysander Philippa Tadeusz Eulalia Fitzgerald Noor Ambrogio Hyacinth
Rasmus Imogen Cosimo Tallulah Valentin""".split()  # noqa: SIM905
LAST = """Okonkwo Vansittart Castellanos Przybylski Abernethy Nakashima Fairweather Oyelaran Lindqvist Montgomerie
Haldorsen Achterberg Quaye Winterbourne Szczepanska Delacroix-Reyes Ravenscroft Mbeki-Lowe Torvaldsen
Amadi Featherstonehaugh Kowalczyk Ambrosetti Ngata Bellweather Strzelecki Umeadi Hollingworth Valdivieso
Eskildsen Marchetti-Osei Pemberton-Quist Arkwright Zoltanski Inglethorpe Obuya Castellane Thistlewood
Brannigan Yilmazer Sandoval-Park Rutherglen Okafor-Brandt Lamarche Vukovic Ashdown Kristiansen
Mwangi-Hart Belliveau Oduya Tremaine Wojcikowski Ferreira-Lund Hazelgrove Adeyemi Ostrowski Penhaligon
Quartermaine Ibarguen Drummond-Yates Solberg Nwachukwu Carrington""".split()  # noqa: SIM905
DOMAINS = ["mailbox.example", "post.example.org", "example.net", "inbox.example.co.uk"]
MONTH_NAMES = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
]
PREAMBLE = (
    "I have been a loyal customer for many years and I have to say the last few weeks were frustrating. "
    "I called twice, waited on hold for ages, and the chat window kept disconnecting before anyone "
    "answered, so I am writing instead and hoping this reaches the right team. Anyway, "
)

# --- Values and their written formats ----------------------------------------------------------------
# In each list the formats before SEED_OK[kind] are ones the seed harness reads correctly.

FORMATS: dict[str, list[str]] = {
    "order_id": ["{L}-{n}", "{l}-{n}", "#{L}{n}", "{L}{n}", "{l}{n}"],
    "amount": ["${dot}", "$ {dot}", "{dot} USD", "USD {dot}", "{comma} EUR", "€{comma}", "£{dot}"],
    "tracking_number": ["TRK{n}", "trk{n}", "TRK-{n}", "TRK {spaced}", "trk {n}"],
    "postcode": ["{out} {inw}", "{lo_out} {lo_inw}", "{out}{inw}", "{lo_out}{lo_inw}"],
    "account_id": ["ACC-{n}", "acc-{n}", "ACC{n}", "ACC {n}", "acc{n}"],
    "email": ["{e}", "{E}"],
    "phone": ["+44 {a} {b}", "+44{a}{b}", "0{a} {b}", "0{a}-{b3}-{b4}", "0044 {a} {b}", "+44 (0){a} {b}"],
    "date": ["{iso}", "{dd}/{mm}/{yyyy}", "{d} {Month} {yyyy}", "{Month} {d}, {yyyy}", "{d}{suffix} of {Month} {yyyy}"],
    "card_last4": [
        "ending in {n}",
        "ending {n}",
        "ends in {n}",
        "**** **** **** {n}",
        "last four digits {n}",
        "xxxx-{n}",
    ],
}
SEED_OK = {
    "order_id": 1,
    "amount": 2,
    "tracking_number": 1,
    "postcode": 2,
    "account_id": 1,
    "email": 1,
    "phone": 2,
    "date": 1,
    "card_last4": 2,
}

# --- Phrasings: (style, template). "seed" uses the seed harness's keywords, "synonym" does not. ---------

TEMPLATES: dict[str, list[tuple[str, str]]] = {
    "refund_order": [
        (
            "seed",
            "Hi, this is {name}. I'd like a refund for order {order_id}: "
            "I paid {amount} and the blender arrived cracked.",
        ),
        ("seed", "Please refund {amount} for {order_id}. The jacket was the wrong size. Thanks, {name}"),
        ("seed", "{name} here. Order {order_id} never turned up, so I want a refund of {amount}."),
        (
            "synonym",
            "Hello, {name} writing. The kettle from order {order_id} stopped working after a day. "
            "Can I get my money back? It was {amount}.",
        ),
        ("synonym", "I was charged twice for order {order_id}. Please reimburse the extra {amount}. Regards, {name}"),
        ("synonym", "Hi, could you pay back the {amount} I spent on {order_id}? The lamp was faulty. {name}"),
    ],
    "track_shipment": [
        ("seed", "Can you track my parcel please? The tracking number is {tracking_number}. {name}"),
        ("seed", "Hi, {name} here. I'd like to track shipment {tracking_number}, it's been a week."),
        (
            "synonym",
            "Where is my package? It still hasn't arrived. Courier reference {tracking_number}. Thanks, {name}",
        ),
        ("synonym", "My parcel {tracking_number} seems stuck somewhere. Any news on it? {name}"),
        ("synonym", "Hello, I'm {name}. The package with reference {tracking_number} is late, what is its status?"),
    ],
    "change_address": [
        ("seed", "Hi, I need to change the delivery address for order {order_id}. New postcode: {postcode}. {name}"),
        ("seed", "{name} here. Please update the address on {order_id} to postcode {postcode}."),
        (
            "synonym",
            "I've just moved house. Could you send order {order_id} to my new place instead? "
            "Postcode {postcode}. Cheers, {name}",
        ),
        ("synonym", "Hello, please redirect {order_id} to {postcode}, I'm staying with my sister. {name}"),
        ("synonym", "{name}: wrong postcode on order {order_id}! It should be {postcode}."),
    ],
    "cancel_subscription": [
        ("seed", "Please cancel my subscription. Account {account_id}. {name}"),
        ("seed", "Hi, {name} here, I want to cancel the subscription on account {account_id}."),
        ("synonym", "I no longer want the monthly box. Stop billing account {account_id}, please. {name}"),
        ("synonym", "Hello, please end my membership for {account_id} at the end of this month. {name}"),
    ],
    "reset_password": [
        ("seed", "I forgot my password. Could you send a reset link to {email}? {name}"),
        ("seed", "Please reset my password, the account email is {email}. Thanks! {name}"),
        ("seed", "Hi, {name} here. Password reset please, my email is {email}"),
        ("seed", "Hello, please send a password reset link to {email} - thanks, {name}"),
        ("synonym", "I can't log in to my account any more. My login is {email}, thanks. {name}"),
        ("synonym", "Locked out of my account! Email on file: {email} - {name}"),
        ("synonym", "Hello, I cannot sign in with {email}. Help please. {name}"),
    ],
    "book_callback": [
        ("seed", "Could someone call me on {phone} on {date}? {name}"),
        ("seed", "Hi, {name} here. Please book a callback: my number is {phone} and {date} suits me."),
        ("seed", "Please call me back on {date} at {phone}. Thanks, {name}"),
        ("synonym", "I'd rather speak to a person. Ring me on {phone} on {date}. {name}"),
        ("synonym", "Can an agent phone me on {date}? Number: {phone}. {name}"),
    ],
    "update_payment": [
        ("seed", "Please update my payment card to the one {card_last4}. {name}"),
        ("seed", "Hi, {name} here. New card for my subscription payments: {card_last4}."),
        (
            "synonym",
            "My bank sent me a replacement after the old one expired. "
            "Please use the one {card_last4} from now on. {name}",
        ),
        ("synonym", "Hello, I'd like to switch how I pay to my new Visa, {card_last4}. {name}"),
    ],
}
# Requests that leave a value to the ticket file ("the number on file").
FROM_TICKET: dict[str, list[tuple[str, str, str]]] = {
    "cancel_subscription": [
        ("seed", "Hi, {name} here. Please cancel my subscription, I'm moving abroad.", "account_id"),
        ("synonym", "Please stop my membership, it has become too expensive. {name}", "account_id"),
    ],
    "book_callback": [
        ("seed", "Please call me on the number on file, on {date}. {name}", "phone"),
    ],
}
TOOL_ARGS = {
    "refund_order": ["order_id", "amount"],
    "track_shipment": ["tracking_number"],
    "change_address": ["order_id", "postcode"],
    "cancel_subscription": ["account_id"],
    "reset_password": ["email"],
    "book_callback": ["phone", "date"],
    "update_payment": ["card_last4"],
}
ARG_DESCRIPTIONS = {
    "order_id": "order_id is the order the request is about, as a capital letter, a hyphen and four digits",
    "amount": "amount is the sum to refund as digits with two decimals and no currency",
    "tracking_number": "tracking_number is TRK followed by nine digits",
    "postcode": "postcode is the new postcode in capitals with one space before the last three characters",
    "account_id": "account_id is ACC, a hyphen and six digits",
    "email": "email is the customer's address in lower case",
    "phone": "phone is in international form: +44 and the national number without its leading 0",
    "date": "date is the requested day as YYYY-MM-DD",
    "card_last4": "card_last4 is the last four digits of the new card",
}
# (tool, normal tasks from templates, from-ticket tasks)
PLAN = [
    ("refund_order", 9),
    ("track_shipment", 7),
    ("change_address", 7),
    ("cancel_subscription", 5),
    ("reset_password", 7),
    ("book_callback", 7),
    ("update_payment", 6),
]
LONG_TASKS = 3
# Share of plain tasks phrased with the seed harness's keywords, and share with one argument in a messy format.
SEED_PHRASING = 0.75
MESSY = 0.3


class Values:
    """Draws unique-looking values and renders them in a chosen format."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.used: set[str] = set()
        self.messy_queues: dict[str, list[int]] = {}
        # Every first name and surname at most once, so no two customers share either.
        self.names = [
            f"{f} {s}" for f, s in zip(rng.sample(FIRST, len(FIRST)), rng.sample(LAST, len(LAST)), strict=False)
        ]

    def _unique(self, make: Callable[[], str]) -> str:
        while True:
            value = make()
            if value not in self.used:
                self.used.add(value)
                return value

    def name(self) -> str:
        return self.names.pop()

    def canonical(self, kind: str, name: str) -> str:
        rng = self.rng
        if kind == "order_id":
            return self._unique(lambda: f"{rng.choice('ABCDEFGHJKMNPRTW')}-{rng.randint(1000, 9999)}")
        if kind == "amount":
            return f"{rng.randint(4, 240)}.{rng.choice(['00', '50', '99', '25', '45', '10', '75'])}"
        if kind == "tracking_number":
            return self._unique(lambda: f"TRK{rng.randint(100000000, 999999999)}")
        if kind == "postcode":

            def postcode() -> str:
                area = rng.choice(["SW", "NW", "E", "M", "B", "LS", "EH", "G", "CR", "BS", "N", "SE", "OX", "CB"])
                district = (
                    str(rng.randint(1, 19)) if rng.random() < 0.8 else f"{rng.randint(1, 9)}{rng.choice('ABEHMNPW')}"
                )
                inward = f"{rng.randint(1, 9)}{rng.choice('ABDEFGHJLNPQRSTUWXYZ')}{rng.choice('ABDEFGHJLNPQRSTUWXYZ')}"
                return f"{area}{district} {inward}"

            return self._unique(postcode)
        if kind == "account_id":
            return self._unique(lambda: f"ACC-{rng.randint(100000, 999999)}")
        if kind == "email":
            first, last = name.lower().split(" ", 1)
            return f"{first}.{last.replace('-', '')}@{rng.choice(DOMAINS)}"
        if kind == "phone":
            return self._unique(lambda: f"+447700{rng.randint(900000, 900999)}")
        if kind == "date":
            return f"2026-{rng.randint(3, 5):02d}-{rng.randint(1, 28):02d}"
        if kind == "card_last4":
            return self._unique(lambda: f"{rng.randint(1000, 9999)}")
        raise ValueError(kind)

    def render(self, kind: str, value: str, fmt: str) -> str:
        if kind == "order_id":
            letter, number = value.split("-")
            return fmt.format(L=letter, l=letter.lower(), n=number)
        if kind == "amount":
            return fmt.format(dot=value, comma=value.replace(".", ","))
        if kind == "tracking_number":
            n = value[3:]
            return fmt.format(n=n, spaced=f"{n[:3]} {n[3:6]} {n[6:]}")
        if kind == "postcode":
            out, inw = value.split(" ")
            return fmt.format(out=out, inw=inw, lo_out=out.lower(), lo_inw=inw.lower())
        if kind in ("account_id", "card_last4"):
            return fmt.format(n=value.split("-")[-1])
        if kind == "email":
            local, domain = value.split("@")
            mixed = ".".join(part.capitalize() for part in local.split(".")) + "@" + domain.capitalize()
            return fmt.format(e=value, E=mixed)
        if kind == "phone":
            national = value[3:]  # 7700900123
            return fmt.format(a=national[:4], b=national[4:], b3=national[4:7], b4=national[7:])
        if kind == "date":
            year, month, day = (int(x) for x in value.split("-"))
            suffix = "th" if 11 <= day <= 13 else {1: "st", 2: "nd", 3: "rd"}.get(day % 10, "th")
            return fmt.format(
                iso=value,
                dd=f"{day:02d}",
                mm=f"{month:02d}",
                yyyy=year,
                d=day,
                Month=MONTH_NAMES[month - 1],
                suffix=suffix,
            )
        raise ValueError(kind)

    def pick_format(self, kind: str, messy: bool) -> int:
        ok = SEED_OK[kind]
        if not messy:
            return self.rng.randrange(ok)
        # Cycle through the messy formats of a kind so every one shows up.
        queue = self.messy_queues.setdefault(kind, [])
        if not queue:
            queue.extend(self.rng.sample(range(ok, len(FORMATS[kind])), len(FORMATS[kind]) - ok))
        return queue.pop()


def ticket(values: Values, name: str, overrides: dict[str, str]) -> str:
    rng = values.rng
    data = {
        "customer": name,
        "customer_id": f"CUST-{rng.randint(10000, 99999)}",
        "tier": rng.choice(["standard", "silver", "gold"]),
        "channel": rng.choice(["email", "chat", "web form", "phone"]),
        "account_id": values.canonical("account_id", name),
        "phone_on_file": values.canonical("phone", name),
        "email_on_file": values.canonical("email", name),
        "postcode_on_file": values.canonical("postcode", name),
        "last_order": values.canonical("order_id", name),
    }
    data.update(overrides)
    return json.dumps(data, indent=2) + "\n"


def make_task(
    *, tool: str, message: str, args: dict[str, str], files: dict[str, str], metadata: dict[str, Any]
) -> dict[str, Any]:
    criteria = [{"id": "tool", "description": f"the request is routed to {tool}"}]
    criteria += [{"id": f"arg:{name}", "description": ARG_DESCRIPTIONS[name]} for name in args]
    return {
        "instruction": f"{HEADER}\n\n> {message}\n",
        "files": files,
        "expected": {"tool": tool, "args": args},
        "criteria": criteria,
        "metadata": metadata,
    }


def normal_task(values: Values, tool: str, style_pick: tuple[str, str], *, messy: bool, long: bool) -> dict[str, Any]:
    rng = values.rng
    style, template = style_pick
    name = values.name()
    args: dict[str, str] = {}
    shown: dict[str, str] = {}
    formats: dict[str, str] = {}
    messy_arg = rng.choice(TOOL_ARGS[tool]) if messy else None
    for kind in TOOL_ARGS[tool]:
        value = values.canonical(kind, name)
        index = values.pick_format(kind, messy=kind == messy_arg)
        args[kind] = value
        shown[kind] = values.render(kind, value, FORMATS[kind][index])
        formats[kind] = FORMATS[kind][index]
    message = template.format(name=name, **shown)
    if long:
        keep_case = message.startswith((name, "I ", "I'"))
        message = PREAMBLE + (message if keep_case else message[0].lower() + message[1:])
    overrides = {"email_on_file": args["email"]} if "email" in args else {}
    files = {"ticket.json": ticket(values, name, overrides)}
    metadata = {"kind": "normal", "phrasing": style, "formats": formats, "long": long}
    return make_task(tool=tool, message=message, args=args, files=files, metadata=metadata)


def ticket_task(values: Values, tool: str, pick: tuple[str, str, str]) -> dict[str, Any]:
    style, template, from_file = pick
    name = values.name()
    args = {kind: values.canonical(kind, name) for kind in TOOL_ARGS[tool]}
    shown: dict[str, str] = {}
    formats: dict[str, str] = {}
    for kind in TOOL_ARGS[tool]:
        if kind != from_file:
            index = values.pick_format(kind, messy=False)
            shown[kind] = values.render(kind, args[kind], FORMATS[kind][index])
            formats[kind] = FORMATS[kind][index]
    overrides = {"account_id": args[from_file]} if from_file == "account_id" else {"phone_on_file": args[from_file]}
    files = {"ticket.json": ticket(values, name, overrides)}
    metadata = {"kind": "from_ticket", "phrasing": style, "formats": formats, "from_ticket": from_file, "long": False}
    return make_task(tool=tool, message=template.format(name=name, **shown), args=args, files=files, metadata=metadata)


def hard_tasks(values: Values) -> list[dict[str, Any]]:
    """Requests no generic harness gets right every time."""
    tasks = []

    def add(tool: str, reason: str, message: str, args: dict[str, str], name: str, **overrides: str) -> None:
        files = {"ticket.json": ticket(values, name, overrides)}
        metadata = {"kind": "hard", "reason": reason, "long": False}
        tasks.append(make_task(tool=tool, message=message, args=args, files=files, metadata=metadata))

    n = values.name()
    order, amount, account = (values.canonical(k, n) for k in ("order_id", "amount", "account_id"))
    add(
        "refund_order",
        "two intents; the first one is the main request",
        f"I want my money back for {order} (${amount}), and after that please cancel my subscription {account}. {n}",
        {"order_id": order, "amount": amount},
        n,
        account_id=account,
    )

    n = values.name()
    last4 = values.canonical("card_last4", n)
    add(
        "update_payment",
        "mentions cancel but asks for a card change",
        f"I don't want to cancel anything, I just need the card on file changed to the one ending in {last4}. {n}",
        {"card_last4": last4},
        n,
    )

    n = values.name()
    trk, order, amount = (values.canonical(k, n) for k in ("tracking_number", "order_id", "amount"))
    add(
        "refund_order",
        "a lost parcel: the tracking number is context, the refund is the request",
        f"My parcel {trk} was lost in transit. Please refund ${amount} for order {order}. {n}",
        {"order_id": order, "amount": amount},
        n,
    )

    n = values.name()
    order = values.canonical("order_id", n)
    add(
        "refund_order",
        "amount written in words",
        f"Please refund order {order}, it cost twenty-two pounds fifty and broke on the first day. {n}",
        {"order_id": order, "amount": "22.50"},
        n,
    )

    n = values.name()
    phone = values.canonical("phone", n)
    add(
        "book_callback",
        "relative date",
        f"Call me back next Tuesday on {values.render('phone', phone, FORMATS['phone'][0])}, please. {n}",
        {"phone": phone, "date": "2026-03-10"},
        n,
        received="2026-03-05 09:12",
    )

    n = values.name()
    first_order, order, amount = (values.canonical(k, n) for k in ("order_id", "order_id", "amount"))
    add(
        "refund_order",
        "two order ids; the second is meant",
        f"Order {first_order} was fine, but {order} arrived broken. Please refund the ${amount} I paid for it. {n}",
        {"order_id": order, "amount": amount},
        n,
    )

    n = values.name()
    order, old, new = (values.canonical(k, n) for k in ("order_id", "postcode", "postcode"))
    add(
        "change_address",
        "two postcodes; the second is the new one",
        f"Please change the delivery address on {order} from {old} to {new}. {n}",
        {"order_id": order, "postcode": new},
        n,
        postcode_on_file=old,
    )

    n = values.name()
    email = values.canonical("email", n)
    local, domain = email.split("@")
    add(
        "reset_password",
        "email spelled out",
        f"Reset my password please, my email is {local.replace('.', ' dot ')} at {domain.replace('.', ' dot ')}. {n}",
        {"email": email},
        n,
        email_on_file="",
    )

    n = values.name()
    order, phone, date = (values.canonical(k, n) for k in ("order_id", "phone", "date"))
    add(
        "book_callback",
        "mentions a refund but asks for a call",
        f"I'd like a callback about my refund for order {order}. Call me on "
        f"{values.render('phone', phone, FORMATS['phone'][0])} on {date}. {n}",
        {"phone": phone, "date": date},
        n,
    )
    return tasks


def generate() -> list[dict[str, Any]]:
    rng = random.Random(SEED)
    values = Values(rng)
    tasks: list[dict[str, Any]] = []
    total_normal = sum(count for _, count in PLAN)
    long_slots = set(rng.sample(range(total_normal), LONG_TASKS))
    slot = 0
    for tool, count in PLAN:
        # Exact shares per tool (not a coin per task), so the mix is what the constants say.
        synonyms = round(count * (1 - SEED_PHRASING))
        styles = rng.sample(["synonym"] * synonyms + ["seed"] * (count - synonyms), count)
        messy_count = round(count * MESSY)
        messy = rng.sample([True] * messy_count + [False] * (count - messy_count), count)
        queues: dict[str, list[tuple[str, str]]] = {"seed": [], "synonym": []}
        for style, is_messy in zip(styles, messy, strict=True):
            if not queues[style]:
                # Cycle through the phrasings of a style so every one is used.
                queues[style] = rng.sample(
                    [t for t in TEMPLATES[tool] if t[0] == style], sum(1 for t in TEMPLATES[tool] if t[0] == style)
                )
            template = queues[style].pop()
            tasks.append(normal_task(values, tool, template, messy=is_messy, long=slot in long_slots))
            slot += 1
        for pick in FROM_TICKET.get(tool, []):
            tasks.append(ticket_task(values, tool, pick))
    tasks += hard_tasks(values)
    rng.shuffle(tasks)
    return [{"id": f"route-{index:03d}", **task} for index, task in enumerate(tasks, start=1)]


def render_jsonl(tasks: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(task, ensure_ascii=False, sort_keys=False) + "\n" for task in tasks)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write tasks.jsonl for the offline support-routing example.")
    parser.add_argument("--output", type=Path, default=TASKS_PATH)
    options = parser.parse_args(argv)
    tasks = generate()
    options.output.write_text(render_jsonl(tasks), encoding="utf-8")
    print(f"wrote {len(tasks)} tasks to {options.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
