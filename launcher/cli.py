"""The ``pqrl`` command line. Each subcommand imports its package only when it runs."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from launcher.errors_cli import Parser, debugging, positive_int, run_command
from launcher.quiet import QUIET_HELP
from pqrl.errors import UsageError

if TYPE_CHECKING:
    from tasks.suite import Suite

__all__ = ["build_parser", "main"]


def _cmd_demo(args: argparse.Namespace) -> int:
    from launcher.demo import DemoConfig, run_demo
    from pqrl.settings import from_arguments

    run_demo(from_arguments(DemoConfig, args))
    return 0


def _cmd_model_prepare(args: argparse.Namespace) -> int:
    from pqrl.model_cache import prepare_model

    print(prepare_model(args.name))
    return 0


def _cmd_build_image(args: argparse.Namespace) -> int:
    from sandboxes.image import build_image, build_image_from_dockerfile

    def progress(m: str) -> None:
        print(m, file=sys.stderr)

    if args.dockerfile:
        if not os.path.isfile(args.dockerfile):
            raise UsageError(f"--dockerfile {args.dockerfile}: no such file", fix="check the path")
        name = args.name or "pqrl-sandbox"
        print(build_image_from_dockerfile(args.dockerfile, name=name, force=args.force, progress=progress))
    else:
        print(build_image(force=args.force, mirror=args.mirror, progress=progress))
    return 0


def _cmd_build_recipe(args: argparse.Namespace) -> int:
    from sandboxes.recipes import RepoRecipe, build_recipe

    recipe = RepoRecipe.from_json(args.recipe)
    print(build_recipe(recipe, force=args.force, progress=lambda m: print(m, file=sys.stderr)))
    return 0


def _cmd_search(args: argparse.Namespace) -> int:
    from tasks.retrieval_server import index_command, serve

    return serve(args) if args.search_command == "serve" else index_command(args)


def _cmd_reap(args: argparse.Namespace) -> int:
    import asyncio

    from sandboxes.docker_api import DockerAPI
    from sandboxes.reaper import reap

    async def once() -> list[str]:
        api = DockerAPI()
        try:
            return await reap(api)
        finally:
            await api.close()

    removed = asyncio.run(once())
    print(f"removed {len(removed)} sandbox container(s)")
    return 0


def _cmd_env_server(args: argparse.Namespace) -> int:
    from env_server.app import ServerSettings, create_app
    from env_server.http_guard import uvicorn_options
    from pqrl.serving import listening_socket, serve

    settings = ServerSettings(**({"insecure_local": True} if args.insecure_local else {}))
    try:
        app = create_app(settings)
    except ValueError as e:
        print(f"pqrl env-server: {e}", file=sys.stderr)
        return 2
    if settings.token is None and args.host not in ("127.0.0.1", "localhost", "::1"):
        print("pqrl env-server: --insecure-local only binds to loopback", file=sys.stderr)
        return 2
    serve(app, listening_socket(args.host, args.port), log_level=args.log_level, **uvicorn_options(settings))
    return 0


def _cmd_env_list(args: argparse.Namespace) -> int:
    from env_server.sessions import SessionManager

    for env in SessionManager().environments():
        if "error" in env:
            print(f"{env['id']}: BROKEN: {env['error']}")
            continue
        tools = ", ".join(t["function"]["name"] for t in env["tools"])
        sandbox = " [sandbox]" if env["needs_sandbox"] else ""
        print(f"{env['id']}{sandbox}: {tools}")
    return 0


def _generated_suite(args: argparse.Namespace) -> Suite:
    """The built-in generator ``args.kind`` run with the flags that apply to it."""
    from tasks.generators import Generate, generate_suite

    g = Generate(args.kind, n=args.n or (200 if args.kind == "search" else 256), seed=args.seed,
                 name=args.name or args.kind, shots=args.shots, level=args.level,
                 format_reward=args.format_reward)  # fmt: skip
    try:
        return generate_suite(g)
    except ValueError as e:
        raise UsageError(str(e), fix="pqrl tasks generate --help lists the flags") from None


def _cmd_tasks(args: argparse.Namespace) -> int:
    import asyncio
    import json

    from launcher.generate_command import from_project, generate_command
    from launcher.suite_file import write_suite
    from tasks.suite import SuiteInvalid, load_suite

    if args.tasks_command == "generate" and from_project(args):
        return generate_command(args)
    if args.tasks_command == "generate":
        suite = _generated_suite(args)
        corpus = suite.manifest.defaults.get("corpus")
        if args.corpus_out and not isinstance(corpus, list):
            raise UsageError(
                "--corpus-out: only a search suite has a corpus", fix="pqrl tasks generate search"
            )
        write_suite(suite, args.output)
        print(f"wrote {suite.id} ({len(suite.tasks)} tasks) to {args.output}")
        if args.corpus_out:  # for pqrl search index / serve
            with open(args.corpus_out, "w") as f:
                f.writelines(json.dumps(d) + "\n" for d in corpus)
            print(f"wrote its corpus ({len(corpus)} documents) to {args.corpus_out}")
        return 0
    if args.tasks_command in ("validate", "submit"):
        try:
            suite = load_suite(args.file)
        except SuiteInvalid as e:
            if args.tasks_command == "validate":  # every problem is the result; the error line sums up
                print("\n".join(str(p) for p in e.problems))
                raise UsageError(f"{args.file}: {len(e.problems)} problem(s), listed above") from e
            raise
        if args.check:  # every task's worked example earns 1 and its empty episode 0
            from launcher.tasks_import import check_suite_command

            check_suite_command(suite, args.jobs)
        if args.tasks_command == "validate":
            print(
                f"{suite.id}: {len(suite.tasks)} valid {suite.manifest.kind} tasks "
                f"for {suite.manifest.env_id}"
            )
            return 0
    from pqrl.envvars import redis_url
    from tasks.storage import SuiteStore

    async def run() -> int:
        store = SuiteStore(redis_url(args.redis_url))
        try:
            if args.tasks_command == "submit":
                queued = await store.submit(suite, args.run)
                state = (
                    f"queued {queued} tasks" if queued is not None else "already submitted: nothing queued"
                )
                print(f"{suite.id} -> run {args.run}: {state}")
            elif args.tasks_command == "list":
                for m in await store.list():
                    print(f"{m['id']}  v{m['version']}  {m['kind']}  {m['env_id']}  {m['tasks']} tasks")
            else:
                ref, _, task_id = args.id.partition("/")
                shown = await store.get(ref)
                if task_id:
                    print(json.dumps(shown.task(task_id).model_dump(), indent=2))
                else:
                    print(json.dumps(shown.manifest.model_dump(), indent=2))
                    for t in shown.tasks[:5]:
                        print(f"  {t.id}: {getattr(t, 'question', getattr(t, 'issue', ''))[:100]}")
                    print(f"  ... {len(shown.tasks)} tasks")
            return 0
        except KeyError as e:  # no such suite or task
            raise UsageError(str(e.args[0]), fix="pqrl tasks list shows the stored suites") from None
        finally:
            await store.aclose()

    return asyncio.run(run())


def _cmd_engine_serve(args: argparse.Namespace) -> int:
    from engine.serve_command import serve

    return serve(args)


def _cmd_rollout(args: argparse.Namespace) -> int:
    from launcher.rollout_commands import rollout

    return rollout(args)


def _cmd_tasks_filter(args: argparse.Namespace) -> int:
    from launcher.rollout_commands import filter_tasks

    return filter_tasks(args)


def _cmd_trajectories_show(args: argparse.Namespace) -> int:
    from launcher.rollout_commands import show_trajectories

    return show_trajectories(args)


def _cmd_train(args: argparse.Namespace) -> int:
    from launcher.train_command import train_command

    return train_command(args)


def _cmd_eval(args: argparse.Namespace) -> int:
    from launcher.eval_command import eval_command

    return eval_command(args)


def _cmd_status(args: argparse.Namespace) -> int:
    from launcher.status import status_command

    return status_command(args)


def _cmd_sft(args: argparse.Namespace) -> int:
    from agent_loop.demonstrations import resolve_demonstrations
    from launcher.sft_command import sft_command

    return sft_command(args, load_demonstrations=resolve_demonstrations)


_SubParsers = argparse._SubParsersAction


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="pqrl", description="Agentic RL: rollouts in sandboxes, GRPO training.")
    parser.add_argument("--debug", action="store_true", help="print a failure's traceback (or PQRL_DEBUG=1)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    groups: dict[str, _SubParsers] = {}

    def group(name: str, help: str) -> _SubParsers:
        if name not in groups:
            p = sub.add_parser(name, help=help)
            groups[name] = p.add_subparsers(dest=f"{name}_command", required=True, metavar="COMMAND")
        return groups[name]

    # each family's flags come from its settings classes, which are standard library only: building
    # the parser imports no torch
    for add in (_add_demo_and_model, _add_sandbox_and_env, _add_tasks, _add_engine, _add_rollout, _add_train):
        add(sub, group)
    _add_search(sub, group)
    return parser


def _add_search(sub: _SubParsers, group: Callable[[str, str], _SubParsers]) -> None:
    search = group("search", "search corpora and the retrieval server")
    serve = search.add_parser("serve", help="serve a corpus over Search-R1's retrieval API (/retrieve)")
    index = search.add_parser("index", help="check and index a corpus file once; prints its sha256: name")
    for p in (serve, index):
        p.add_argument("--corpus", required=True, help="JSONL of id, title, text")
        p.set_defaults(func=_cmd_search)
    serve.add_argument("--host", default="127.0.0.1", help="no token is asked: keep it on loopback")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--topk", type=int, default=3, help="for requests that give none (1 to 100)")
    serve.add_argument("--log-level", default="warning")


def _add_demo_and_model(sub: _SubParsers, group: Callable[[str, str], _SubParsers]) -> None:
    from launcher.demo import DemoConfig
    from pqrl.model_cache import DEFAULT_MODEL
    from pqrl.settings import add_arguments

    demo = sub.add_parser("demo", help="end-to-end demo: model -> trajectories -> Redis store -> consumer")
    add_arguments(demo, DemoConfig)
    demo.set_defaults(func=_cmd_demo)
    prep = group("model", "offline model cache").add_parser("prepare", help="convert the GGUF model once")
    prep.add_argument("--name", default=DEFAULT_MODEL)
    prep.set_defaults(func=_cmd_model_prepare)


def _add_sandbox_and_env(sub: _SubParsers, group: Callable[[str, str], _SubParsers]) -> None:
    build = group("sandbox", "sandbox images").add_parser("build-image", help="build the base image offline")
    build.add_argument("--force", action="store_true", help="rebuild even if the image exists")
    build.add_argument("--mirror", default=None, help="Debian mirror URL for debootstrap")
    build.add_argument(
        "--dockerfile", default=None, help="build from this Dockerfile instead (needs its base)"
    )
    build.add_argument("--name", default=None, help="image name for --dockerfile builds")
    build.set_defaults(func=_cmd_build_image)
    recipe = group("sandbox", "sandbox images").add_parser("build-recipe", help="build a repository's image")
    recipe.add_argument("recipe", help="RECIPE.json: name, source, base_commit, requirements, install")
    recipe.add_argument("--force", action="store_true", help="rebuild even if the image exists")
    recipe.set_defaults(func=_cmd_build_recipe)
    reap_cmd = group("sandbox", "sandbox images").add_parser(
        "reap", help="remove sandbox containers whose owner is gone or whose lifetime expired"
    )
    reap_cmd.set_defaults(func=_cmd_reap)

    server = sub.add_parser("env-server", help="serve registered tool environments over HTTP")
    server.add_argument("--host", default="127.0.0.1")
    server.add_argument("--port", type=int, default=8100)
    server.add_argument("--insecure-local", action="store_true", help="no token (loopback only)")
    server.add_argument("--log-level", default="warning")
    server.set_defaults(func=_cmd_env_server)
    group("env", "tool environments").add_parser(
        "list", help="registered environments and tools"
    ).set_defaults(func=_cmd_env_list)
    from launcher.env_check import add_check_arguments, env_check

    check = group("env", "tool environments").add_parser("check", help="run the conformance checker on one")
    add_check_arguments(check)
    check.set_defaults(func=env_check)


def _add_tasks(sub: _SubParsers, group: Callable[[str, str], _SubParsers]) -> None:
    from agent_loop.config import EpisodeConfig
    from launcher.engine_choice import add_backend_argument
    from launcher.generate_command import add_generate_arguments
    from launcher.model_io import add_template_arguments
    from launcher.tasks_import import add_check_arguments, add_import_parser
    from pqrl.model_cache import DEFAULT_MODEL
    from pqrl.settings import add_arguments
    from tasks.generators import GENERATED

    tasks = group("tasks", "task suites")
    p = tasks.add_parser("validate", help="check a suite file and list every problem")
    p.add_argument("file")
    p = tasks.add_parser("submit", help="store a suite and queue its tasks for a run (idempotent)")
    p.add_argument("file")
    p.add_argument("--run", required=True)
    tasks.add_parser("list", help="suites stored in Redis")
    p = tasks.add_parser("show", help="a stored suite (NAME, NAME@DIGEST or DIGEST) or one task (SUITE/TASK)")
    p.add_argument("id")
    p = tasks.add_parser("generate", help="write a built-in suite (calc, data, search, coding) as JSONL")
    p.add_argument("kind", choices=GENERATED)
    p.add_argument(
        "--n", type=positive_int, default=None, help="number of tasks (search 200, else 256; not coding)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--shots", type=int, default=None, help="worked examples (calc 1, data 2, others 0)")
    p.add_argument("--level", type=int, choices=[1, 2], default=None, help="calc/data: 1 or 2 (calc 2)")
    p.add_argument("--format-reward", type=float, default=0.0, help="calc/data/search: grounded-miss credit")
    p.add_argument("--name", default=None, help="suite name (default: the kind)")
    p.add_argument("-o", "--output", "--out", required=True)
    p.add_argument(
        "--corpus-out", default=None, help="search: also write its corpus as JSONL (pqrl search serve)"
    )
    add_generate_arguments(p)
    p = tasks.add_parser("filter", help="keep the tasks the policy sometimes solves (0 < pass rate < 1)")
    p.add_argument("suite", help="suite file")
    p.add_argument("-o", "--output", required=True, help="where the filtered suite goes")
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--engine", default=None, help="engine URL (default: a built-in engine in this process)")
    add_backend_argument(p, starts=True)
    p.add_argument("--samples", type=positive_int, default=8)
    p.add_argument("--low", type=float, default=0.0)
    p.add_argument("--high", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0, help="episode sampling seed: the same pass rates every run")
    p.add_argument("--quiet", action="store_true", help=QUIET_HELP)
    add_arguments(p, EpisodeConfig, exclude=("seed",))
    add_template_arguments(p)
    for name, task_parser in tasks.choices.items():
        if name in ("submit", "list", "show"):
            task_parser.add_argument("--redis-url", default=None, help="default: $PQRL_REDIS_URL")
        task_parser.set_defaults(func=_cmd_tasks_filter if name == "filter" else _cmd_tasks)
        if name in ("validate", "submit"):
            add_check_arguments(task_parser)
    from launcher.harbor_command import add_import_harbor

    importer = tasks.add_parser("import", help="write a suite from another benchmark's tasks")
    sources = importer.add_subparsers(dest="import_source", required=True, metavar="SOURCE")
    add_import_parser(sources)
    add_import_harbor(sources)


def _add_engine(sub: _SubParsers, group: Callable[[str, str], _SubParsers]) -> None:
    from engine.config import add_serve_arguments  # light: standard library only

    eng = group("engine", "inference engines").add_parser("serve", help="built-in engine server or SGLang")
    add_serve_arguments(eng)  # one flag per field of engine.config.EngineConfig and ServeConfig
    eng.set_defaults(func=_cmd_engine_serve)


def _add_rollout(sub: _SubParsers, group: Callable[[str, str], _SubParsers]) -> None:
    from launcher.rollout_commands import add_rollout_arguments  # light: argparse only until called
    from pqrl.model_cache import DEFAULT_MODEL

    ro = sub.add_parser("rollout", help="rollout manager: queued tasks -> groups in the trajectory stream")
    add_rollout_arguments(ro)
    ro.set_defaults(func=_cmd_rollout)
    show = group("trajectories", "stored trajectories").add_parser(
        "show", help="print stored groups as trained"
    )
    show.add_argument("--run", required=True)
    show.add_argument("--redis-url", default=None, help="default: $PQRL_REDIS_URL")
    show.add_argument("--groups", type=positive_int, default=2, help="the most recent N groups")
    show.add_argument("--model", default=DEFAULT_MODEL, help="tokenizer to decode with")
    show.add_argument("--brief", action="store_true", help="figures only, no token streams")
    show.set_defaults(func=_cmd_trajectories_show)


def _add_train(sub: _SubParsers, group: Callable[[str, str], _SubParsers]) -> None:
    from launcher.eval_command import add_eval_arguments  # light: argparse only until called
    from launcher.status import add_status_arguments
    from launcher.train_command import add_train_arguments  # light: no torch until called

    tr = sub.add_parser("train", help="a whole training job from one YAML config (embedded or distributed)")
    add_train_arguments(tr)
    tr.set_defaults(func=_cmd_train)
    ev = sub.add_parser(
        "eval", help="held-out pass@1 and pass@k of a checkpoint (or a model), with intervals"
    )
    add_eval_arguments(ev)
    ev.set_defaults(func=_cmd_eval)
    st = sub.add_parser("status", help="a running job's step, version, queue, staleness, reward trend")
    add_status_arguments(st)
    st.set_defaults(func=_cmd_status)
    from launcher.view_command import add_view_parser  # light: no pyarrow until a page is asked for

    add_view_parser(sub)

    sft = sub.add_parser("sft", help="cold start: fine-tune on demonstration trajectories (mask-1 tokens)")
    sft.add_argument(
        "config", help="YAML file: the SFTConfig fields (trainer/sft.py) and the model section of pqrl train"
    )
    sft.add_argument("--output-dir", help="override output_dir")
    sft.add_argument(
        "--demonstrations", help="override demonstrations (a file, calc:N[:SEED] or suite:FILE[:N])"
    )
    sft.add_argument("--max-steps", type=int, help="override max_steps")
    sft.add_argument("--device", help="override device")
    sft.add_argument(
        "--quiet",
        "--no-progress",
        dest="quiet",
        action="store_true",
        help=QUIET_HELP,
    )
    sft.set_defaults(func=_cmd_sft)


def main(argv: Sequence[str] | None = None) -> int:
    debug, rest = debugging(list(sys.argv[1:] if argv is None else argv))  # --debug anywhere
    args = build_parser().parse_args(rest)
    return run_command(args.func, args, debug=debug)


if __name__ == "__main__":
    sys.exit(main())
