"""read_number tasks: a file path and the number it holds; generated from a seed, split by number.

    tasks = make_tasks(count=64, split="train", seed=0)    # (instruction, payload) pairs
    insert_tasks(session, environment="read-number", tasks=tasks)

With `named=False` the instruction does not name the file (`UNNAMED`): the agent has to find it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from core.errors import ConfigError
from core.models import Task

FILE_NAMES = ("number.txt", "secret.txt", "answer.txt", "value.txt")
UNNAMED = "A file in the workspace holds a number. Find it and submit it."


class ReadNumberTask(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    """File name under the workspace."""
    number: str = Field(pattern=r"^[0-9]{1,12}$")
    """What the file holds, and the only accepted answer."""


@dataclass(frozen=True)
class NewTask:
    external_id: str
    split: str
    instruction: str
    payload: ReadNumberTask


def instruction_for(task: ReadNumberTask, *, named: bool = True) -> str:
    return f"The file {task.path} holds a number. Read it and submit it." if named else UNNAMED


def make_tasks(*, count: int, split: str, seed: int, digits: tuple[int, int] = (2, 4),
               exclude: set[str] | None = None, file_names: tuple[str, ...] = FILE_NAMES,
               named: bool = True) -> list[NewTask]:
    """`count` distinct tasks; numbers in `exclude` are never used (keeps splits disjoint). `named`:
    the instruction names the file (else it is `UNNAMED`, the same for every task)."""
    rng = random.Random(f"read_number:{split}:{seed}")
    taken = set(exclude or ())
    low, high = digits
    available = 10**high - 10 ** (low - 1) - sum(1 for n in taken if low <= len(n) <= high)
    if count > available:
        raise ConfigError(f"count: expected at most {available} tasks with {low}-{high} digit numbers, got {count}")
    tasks: list[NewTask] = []
    while len(tasks) < count:
        width = rng.randint(*digits)
        number = str(rng.randrange(10 ** (width - 1), 10**width))
        if number in taken:
            continue
        taken.add(number)
        payload = ReadNumberTask(path=rng.choice(file_names), number=number)
        tasks.append(NewTask(external_id=f"{split}-{number}", split=split, instruction=instruction_for(payload, named=named),
                             payload=payload))
    return tasks


def make_splits(*, train: int, test: int, seed: int, digits: tuple[int, int], file_names: tuple[str, ...] = FILE_NAMES,
                named: bool = True) -> tuple[list[NewTask], list[NewTask]]:
    """`train` and `test` tasks whose numbers never coincide (a held-out task is never a trained one)."""
    train_tasks = make_tasks(count=train, split="train", seed=seed, digits=digits, file_names=file_names, named=named)
    test_tasks = make_tasks(count=test, split="test", seed=seed, digits=digits, file_names=file_names, named=named,
                            exclude={t.payload.number for t in train_tasks})
    return train_tasks, test_tasks


def insert_tasks(session: Session, *, environment: str, tasks: list[NewTask]) -> int:
    """Upsert by (environment, external id); flushed, the caller commits."""
    for task in tasks:
        statement = insert(Task).values(
            environment_name=environment, external_id=task.external_id, split=task.split,
            instruction=task.instruction, payload=task.payload.model_dump(), pass_rate_samples=0,
        )
        session.execute(statement.on_conflict_do_update(
            index_elements=[Task.environment_name, Task.external_id],
            set_={"instruction": task.instruction, "split": task.split, "payload": task.payload.model_dump()},
        ))
    session.flush()
    return len(tasks)
