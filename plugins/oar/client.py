"""Talking to one OAR server: through its commands, or through its REST API.

Why two clients with one interface: on the OAR server (or a frontend) the commands are always
there and need no web server; a site master elsewhere in the grid can only reach another
site's OAR over HTTP. Both return the same `OarJob` records and raise `CommandError` naming
the command (or URL) and the job, so the Saline manager does not care which one it holds.

Identity: OAR refuses jobs from root and oar (admission rule #2), so the manager submits on
behalf of the job's user: the CLI client runs the commands under `runuser -u USER` when it
is root, the REST client sends `X-Remote-Ident: USER` (hyphens: Apache drops `_` headers).
"""

from __future__ import annotations

import os
import pwd
import re
import signal
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import requests

from plugins.oar.parse import (
    MAX_TEXT,
    STATES,
    OarJob,
    job_from_dict,
    parse_jobs,
    parse_resources,
    resources_from_data,
)
from vjob import proc
from vjob.errors import CommandError, CommandUnavailable, InputError
from vjob.secrets import mask_url

# Every grammar is applied with re.fullmatch: `$` would accept a trailing newline, and a
# newline in a word handed to oarsub adds a second command to the line OAR runs in a shell.
USER = re.compile(r"[a-z_][a-z0-9_.-]{0,31}")
JOB_ID = re.compile(r"[0-9]{1,12}")
_RESOURCE = re.compile(r"[A-Za-z0-9_/=,:{}' .-]{1,512}")
_PROPERTIES = re.compile(r"[A-Za-z0-9_=<>!' ().,-]{0,1024}")
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_WORD = re.compile(r"[A-Za-z0-9_/.=:,+@%-]{1,1024}")
WALLTIME = re.compile(r"[0-9]{1,4}(:[0-9]{1,2}){0,2}")  # [0-9]: \d takes any script's digits
_JOB_ID_LINE = re.compile(r"OAR_JOB_ID=(\S*)")
"""oarsub's answer line; what follows `=` is then checked against JOB_ID (\\d took other
scripts' digits and any length for a job id: fuzzed)."""
PAGE = 500
"""Items asked per page of an API collection (OAR's own default page size)."""
MAX_PAGES = 250
"""At most MAX_PAGES pages are read from one collection (about 100 000 jobs)."""
OVERLAP = 100
"""Items each page repeats from the previous one: the jobs that may end between two pages."""
TYPES = frozenset({"besteffort", "idempotent", "timesharing", "deploy", "cosystem", "noop"})


class OarUnavailable(CommandError):
    """OAR could not be asked at all (unreachable, timed out, server error, commands missing):
    it comes back by itself, so a caller retries. Any other CommandError is an answer that
    makes no sense (a refusal, garbage), which retrying the same way will not mend."""


def check_user(user: str) -> str:
    if not isinstance(user, str) or not USER.fullmatch(user):
        raise InputError(f"user = {_short(user)}: not a valid login name")
    return user


def check_job_id(job_id: str) -> str:
    if not JOB_ID.fullmatch(str(job_id)):
        raise InputError(f"OAR job id = {_short(job_id)}: must be a number")
    return str(job_id)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


@dataclass(frozen=True, slots=True)
class SubmitRequest:
    """What `oarsub` is asked; every field is validated so no job data reaches a shell."""

    command: list[str]
    resource: str = "/resource_id=1"
    walltime: str = "1:00:00"
    name: str = ""
    types: tuple[str, ...] = ()
    properties: str = ""
    checkpoint_s: int = 0
    signal: int = 0
    directory: str = ""

    def __post_init__(self) -> None:
        if not self.command:
            raise InputError("command: must not be empty")
        if len(self.command) > 256:
            raise InputError(f"command: {len(self.command)} words, at most 256")
        for i, word in enumerate(self.command):
            if not isinstance(word, str) or not _WORD.fullmatch(word):
                raise InputError(f"command[{i}] = {_short(word)}: only plain words (no spaces or shell characters)")
        if not isinstance(self.resource, str) or not _RESOURCE.fullmatch(self.resource):
            raise InputError(f"resource = {_short(self.resource)}: not an OAR resource request like /nodes=1/core=2")
        if not isinstance(self.walltime, str) or not WALLTIME.fullmatch(self.walltime):
            raise InputError(f"walltime = {_short(self.walltime)}: must be H[:MM[:SS]]")
        if self.name and (not isinstance(self.name, str) or not _NAME.fullmatch(self.name)):
            raise InputError(f"name = {_short(self.name)}: letters, digits, '_', '.', '-' only (at most 64)")
        for t in self.types:
            if t not in TYPES:
                raise InputError(f"type = {_short(t)}: must be one of {', '.join(sorted(TYPES))}")
        if not isinstance(self.properties, str) or not _PROPERTIES.fullmatch(self.properties):
            raise InputError(f"properties = {_short(self.properties)}: unexpected characters")
        if self.directory and (not isinstance(self.directory, str) or not _WORD.fullmatch(self.directory)):
            raise InputError(f"directory = {_short(self.directory)}: only a plain path")
        if self.checkpoint_s < 0 or not 0 <= self.signal <= 64:
            raise InputError(f"checkpoint = {self.checkpoint_s}, signal = {self.signal}: out of range")

    @property
    def resource_spec(self) -> str:
        return f"{self.resource},walltime={self.walltime}"

    @property
    def command_line(self) -> str:
        # Every word was checked to be free of shell characters: joining cannot inject anything.
        return " ".join(self.command)

    def oarsub_args(self) -> list[str]:
        args = ["-l", self.resource_spec]
        for t in self.types:
            args += ["-t", t]
        if self.name:
            args += ["-n", self.name]
        if self.properties:
            args += ["-p", self.properties]
        if self.checkpoint_s:
            args += ["--checkpoint", str(self.checkpoint_s)]
        if self.signal:
            args += ["--signal", str(self.signal)]
        if self.directory:
            args += ["-d", self.directory]
        return [*args, self.command_line]

    def api_body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"resource": self.resource_spec, "command": self.command_line}
        if self.types:
            body["type"] = list(self.types)
        if self.name:
            body["name"] = self.name
        if self.properties:
            body["property"] = self.properties
        if self.checkpoint_s:
            body["checkpoint"] = str(self.checkpoint_s)
        if self.signal:
            body["signal"] = str(self.signal)
        if self.directory:
            body["directory"] = self.directory
        return body


class OarClient(Protocol):
    """What the adapter and the Saline manager need from one OAR server."""

    where: str

    def submit(self, request: SubmitRequest, *, user: str) -> str: ...

    def job(self, job_id: str, *, user: str) -> OarJob | None: ...

    def jobs(self, states: Collection[str] = ()) -> list[OarJob]: ...

    def resources(self) -> list[dict[str, Any]]: ...

    def delete(self, job_id: str, *, user: str) -> None: ...

    def signal(self, job_id: str, signum: int, *, user: str) -> None: ...

    def checkpoint(self, job_id: str, *, user: str) -> None: ...


class OarCommands:
    """OAR through oarsub/oarstat/oardel/oarnodes, argument lists only, each with a timeout."""

    def __init__(self, bin_dir: str = "", *, timeout_s: float = 30.0) -> None:
        self.bin_dir = bin_dir
        self.timeout_s = timeout_s
        self.where = f"oar commands{' in ' + bin_dir if bin_dir else ''}"

    def _cmd(self, name: str) -> str:
        return str(Path(self.bin_dir) / name) if self.bin_dir else name

    def _run(self, args: list[str], *, user: str | None = None, job: str | None = None) -> str:
        env = None
        cwd = None
        if user and os.geteuid() == 0 and user != "root":
            try:
                home = pwd.getpwnam(check_user(user)).pw_dir
            except KeyError:
                raise InputError(f"user = {user!r}: no such user on this host (OAR runs jobs as the user)") from None
            # oarsub takes the launching directory from $PWD, not getcwd() (notes/oar.md).
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PWD": home, "HOME": home, "LANG": "C"}
            cwd = home
            args = ["runuser", "-u", user, "--", *args]
        try:
            return proc.run(
                args,
                timeout_s=self.timeout_s,
                job=job,
                cwd=cwd,
                env=env,
                missing_hint="is OAR's user package installed (oar-user)?",
            )
        except CommandUnavailable as exc:
            raise OarUnavailable(exc.command, str(exc).split(": ", 1)[-1], job=job) from None

    def submit(self, request: SubmitRequest, *, user: str) -> str:
        out = self._run([self._cmd("oarsub"), *request.oarsub_args()], user=user)
        found = _JOB_ID_LINE.search(out)
        if not found:
            raise CommandError(["oarsub"], f"no OAR_JOB_ID in its output: {out.strip()[:200]!r}")
        if not JOB_ID.fullmatch(found.group(1)):
            raise CommandError(["oarsub"], f"OAR_JOB_ID = {_short(found.group(1))}: not a job number")
        return found.group(1)

    def job(self, job_id: str, *, user: str = "") -> OarJob | None:
        out = self._run([self._cmd("oarstat"), "-f", "-J", "-j", check_job_id(job_id)], job=job_id)
        found = parse_jobs(out, source=f"oarstat -f -J -j {job_id}")
        return found[0] if found else None

    def jobs(self, states: Collection[str] = ()) -> list[OarJob]:
        """Current jobs; only those in `states` when given (oarstat cannot filter: done here)."""
        found = parse_jobs(self._run([self._cmd("oarstat"), "-f", "-J"]), source="oarstat -f -J")
        return [j for j in found if j.state in states] if states else found

    def resources(self) -> list[dict[str, Any]]:
        return parse_resources(self._run([self._cmd("oarnodes"), "-J"]), source="oarnodes -J")

    def delete(self, job_id: str, *, user: str) -> None:
        self._run([self._cmd("oardel"), check_job_id(job_id)], user=user, job=job_id)

    def signal(self, job_id: str, signum: int, *, user: str) -> None:
        self._run([self._cmd("oardel"), "-s", f"SIG{_signame(signum)}", check_job_id(job_id)], user=user, job=job_id)

    def checkpoint(self, job_id: str, *, user: str) -> None:
        self._run([self._cmd("oardel"), "-c", check_job_id(job_id)], user=user, job=job_id)

    def hold(self, job_id: str, *, user: str = "") -> None:
        self._run([self._cmd("oarhold"), check_job_id(job_id)], job=job_id)

    def release(self, job_id: str, *, user: str = "") -> None:
        self._run([self._cmd("oarresume"), check_job_id(job_id)], job=job_id)


def _signame(signum: int) -> str:
    try:
        return signal.Signals(signum).name.removeprefix("SIG")
    except ValueError:
        raise InputError(f"signal = {signum}: not a signal number") from None


class OarRest:
    """OAR through its REST API (oarapi), with the user's identity in X-Remote-Ident."""

    def __init__(self, base_url: str, *, timeout_s: float = 30.0, session: requests.Session | None = None) -> None:
        if not re.match(r"https?://", base_url) or any(c.isspace() for c in base_url):
            raise InputError(f"oar_api_url = {mask_url(base_url)!r}: must start with http:// or https://")
        self.base_url = base_url.rstrip("/")
        self.safe_url = mask_url(self.base_url)
        """What errors, logs and the journal show: the URL without its credentials."""
        self.timeout_s = timeout_s
        self.where = self.safe_url
        self._http = session or requests.Session()
        self.retried = 0
        """Requests asked again because the API's worker died before running them."""

    def _call(self, method: str, path: str, *, user: str = "", job: str | None = None, body: Any = None) -> Any:
        url = f"{self.base_url}/{path}"
        shown = f"{self.safe_url}/{path}"
        headers = {"Accept": "application/json"}
        if user:
            headers["X-Remote-Ident"] = check_user(user)
        for attempt in range(2):
            try:
                resp = self._http.request(method, url, headers=headers, json=body, timeout=self.timeout_s)
            except requests.RequestException as exc:
                why = f"OAR API unreachable: {type(exc).__name__}"
                raise OarUnavailable([f"{method} {shown}"], why, job=job) from None
            if attempt or not _worker_died(resp):
                break
            self.retried += 1
        if resp.status_code == 404 and method == "GET":
            return None
        if resp.status_code >= 400:
            text = " ".join(resp.text.split())[:200]
            error = OarUnavailable if resp.status_code >= 500 else CommandError
            raise error([f"{method} {shown}"], f"HTTP {resp.status_code}: {text}", job=job)
        if len(resp.content) > MAX_TEXT:
            raise CommandError([f"{method} {shown}"], f"answer of {len(resp.content)} bytes: too large", job=job)
        try:
            return resp.json()
        except RecursionError:
            raise CommandError([f"{method} {shown}"], "answer is JSON nested too deeply", job=job) from None
        except ValueError:
            raise CommandError([f"{method} {shown}"], f"answer is not JSON: {resp.text[:120]!r}", job=job) from None

    def version(self) -> dict[str, Any]:
        return dict(self._call("GET", "version.json") or {})

    def submit(self, request: SubmitRequest, *, user: str) -> str:
        out = self._call("POST", "jobs.json", user=user, body=request.api_body())
        if not isinstance(out, dict) or "id" not in out:
            raise CommandError([f"POST {self.safe_url}/jobs.json"], f"no job id in the answer: {_short(out)}")
        return check_job_id(str(out["id"]))

    def job(self, job_id: str, *, user: str) -> OarJob | None:
        out = self._call("GET", f"jobs/{check_job_id(job_id)}.json", user=user, job=job_id)
        if not out:
            return None
        if isinstance(out, dict) and out.get("state") in ("Launching", "Running", "Finishing", "Suspended"):
            # GET /jobs/ID has no hosts: they are a collection of their own.
            found = self._call("GET", f"jobs/{job_id}/resources.json", user=user, job=job_id) or {}
            items = _items(found, source=f"{self.safe_url}/jobs/{job_id}/resources")
            addresses = [i["network_address"] for i in items if "network_address" in i]
            if not all(isinstance(a, str) for a in addresses):
                raise InputError(f"{self.safe_url}/jobs/{job_id}/resources: network_address: not a string")
            out = {**out, "resources": items, "nodes": [{"network_address": a} for a in dict.fromkeys(addresses)]}
        return job_from_dict(job_id, out, source=f"{self.safe_url}/jobs/{job_id}")

    def _all(self, path: str, query: str = "") -> list[dict[str, Any]]:
        """Every item of a collection, page after page: OAR's API answers at most 500 items by
        default, so one GET on a large site silently misses jobs (wrong free cores, missed
        kills). Pages are asked with offset/limit until `total` is reached or a page is empty;
        a collection that keeps growing is bounded by MAX_PAGES.

        Offsets shift while the list changes (a page of 500 jobs takes OAR 25 s): a job that
        ends before the next page moves every later one down, and one of them was missed
        (seen on the real API: 498 of 501). So each page overlaps the previous one by OVERLAP
        items, items are kept once by id, and a page that shares nothing with what was read
        is asked again further back."""
        source = f"{self.safe_url}/{path}"
        items: dict[Any, dict[str, Any]] = {}
        offset = 0
        for _ in range(MAX_PAGES):
            answer = self._call("GET", f"{path}.json?{query}offset={offset}&limit={PAGE}") or {}
            page = _items(answer, source=source)
            keys = [i.get("id", id(i)) for i in page]
            if offset and page and not any(k in items for k in keys):
                offset = max(0, offset - (PAGE - OVERLAP))  # slid past unread items: step back
                continue
            items.update(zip(keys, page, strict=True))
            total = answer.get("total") if isinstance(answer, dict) else None
            if not page or not isinstance(total, int) or isinstance(total, bool) or offset + len(page) >= total:
                return list(items.values())
            offset += max(1, len(page) - OVERLAP)
        raise CommandError([f"GET {source}"], f"more than {MAX_PAGES} pages of {PAGE}: refusing to read on")

    def jobs(self, states: Collection[str] = ()) -> list[OarJob]:
        """Current jobs; only those in `states` when given, filtered by OAR: its API spends about
        60 ms per job listed with details (30 s for 500 waiting jobs, measured on OAR 2.5.9), so
        a caller that needs the running jobs only must not list the waiting ones."""
        source = f"{self.safe_url}/jobs/details"
        query = ""
        if states:
            for state in states:
                if state not in STATES:
                    raise InputError(f"state = {_short(state)}: not an OAR job state")
            query = f"state={','.join(states)}&"
        return [job_from_dict(str(d.get("id")), d, source=source) for d in self._all("jobs/details", query)]

    def resources(self) -> list[dict[str, Any]]:
        items = self._all("resources/full")
        return resources_from_data({"items": items}, source=f"{self.safe_url}/resources/full")

    def delete(self, job_id: str, *, user: str) -> None:
        self._call("DELETE", f"jobs/{check_job_id(job_id)}.json", user=user, job=job_id)

    def signal(self, job_id: str, signum: int, *, user: str) -> None:
        self._call("POST", f"jobs/{check_job_id(job_id)}/signals/{int(signum)}.json", user=user, job=job_id)

    def checkpoint(self, job_id: str, *, user: str) -> None:
        self._call("POST", f"jobs/{check_job_id(job_id)}/checkpoints/new.json", user=user, job=job_id)


def _worker_died(resp: requests.Response) -> bool:
    """The API's FastCGI worker died before running the request: asking again is safe.

    OAR 2.5.9's oarapi.pl exits after 50 requests and mod_fcgid hands the next request to the
    exiting worker: Apache answers its own HTML 500 page ("End of script output before
    headers") and the request was never run (measured on the real API: 120 signals asked, 2
    such 500s, 118 SIGNAL events). An error from OAR's own code is JSON and is not retried."""
    if resp.status_code < 500:
        return False
    try:
        resp.json()
    except ValueError:
        return True
    return False


def _items(answer: Any, *, source: str) -> list[dict[str, Any]]:
    """The `items` of an API collection, each an object (anything else is an InputError)."""
    items = answer.get("items", []) if isinstance(answer, dict) else answer
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise InputError(f"{source}: expected a collection of objects, got {_short(answer)}")
    return items
