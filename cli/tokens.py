"""`crucible token create|ls|revoke`: API tokens. These talk to the database directly (they bootstrap
auth); the token is printed once at creation and only its SHA-256 hash is stored."""

from __future__ import annotations

import typer
from rich.table import Table

from api.services.tokens import create_token, list_tokens, revoke_token
from cli.console import OutputFormat, OutputOption, console, print_json, readable_errors, safe
from core.db import session_scope
from core.models import ApiToken

app = typer.Typer(help="API tokens: create (shown once), list, revoke.", no_args_is_help=True)


def _token_json(row: ApiToken) -> dict[str, object]:
    return {"id": row.id, "name": row.name, "prefix": row.prefix, "created_at": row.created_at,
            "last_used_at": row.last_used_at, "revoked_at": row.revoked_at}


@app.command("create")
def create(name: str = typer.Argument(..., help="What the token is for."), output: OutputFormat = OutputOption) -> None:
    """Create a token and print it once: it cannot be shown again."""
    with readable_errors(), session_scope() as session:
        row, token = create_token(session, name=name)
        data = {**_token_json(row), "token": token}
    if output is OutputFormat.json:
        print_json(data)
        return
    console.print(f"created token [bold]{data['id']}[/] ({safe(name)}); it is shown only this once:")
    console.print(token, highlight=False, soft_wrap=True)
    console.print("use it as CRUCIBLE_API_TOKEN, or paste it into the dashboard's login form", style="dim")


@app.command("ls")
def ls(output: OutputFormat = OutputOption) -> None:
    """Every token: id, name, prefix, when it was last used, whether it is revoked."""
    with readable_errors(), session_scope() as session:
        rows = [_token_json(row) for row in list_tokens(session)]
    if output is OutputFormat.json:
        print_json(rows)
        return
    table = Table("id", "name", "prefix", "created", "last used", "revoked")
    for row in rows:
        table.add_row(str(row["id"]), safe(row["name"]), f"{safe(row['prefix'])}…", _when(row["created_at"]),
                      _when(row["last_used_at"]), _when(row["revoked_at"]))
    console.print(table)


@app.command("revoke")
def revoke(ref: str = typer.Argument(..., help="Token id, name or prefix."), output: OutputFormat = OutputOption) -> None:
    """Revoke a token: every request presenting it gets 401 from then on."""
    with readable_errors(), session_scope() as session:
        data = _token_json(revoke_token(session, ref=ref))
    if output is OutputFormat.json:
        print_json(data)
    else:
        console.print(f"revoked token {data['id']} ({safe(data['name'])}, {safe(data['prefix'])}…)")


def _when(value: object) -> str:
    return "–" if value is None else f"{value:%Y-%m-%d %H:%M}"
