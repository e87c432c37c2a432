"""The JVM reader (`format("rocketmq-jvm")`): where its jar is, and building it with the JDK's `javac`.

The Java sources live in `rmq_eventstore/spark/java/`; they compile against the jars of the installed
pyspark into `rmq_eventstore/spark/jars/rmq-eventstore-spark.jar` (gitignored, like the C extensions).
Without `javac` nothing is built and everything keeps working on the Python source (`format("rocketmq")`);
`local_session()` puts the jar on Spark's classpath when it is there.

    python -m rmq_eventstore.spark.jvm build   # (re)build when a source is newer than the jar
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

FORMAT = "rocketmq-jvm"
CLASS_NAME = "rmqeventstore.spark.RocketMQJvmSource"
_HERE = Path(__file__).resolve().parent
SOURCE_DIR = _HERE / "java"
JAR = _HERE / "jars" / "rmq-eventstore-spark.jar"


class BuildError(RuntimeError):
    """`javac` or `jar` failed on the JVM reader's sources."""


def sources() -> list[Path]:
    """The Java sources and service files the jar is built from."""
    return sorted(p for p in SOURCE_DIR.rglob("*") if p.is_file())


def javac() -> str | None:
    """Path of the JDK's `javac` (JAVA_HOME first, then PATH), None when there is no JDK."""
    home = os.environ.get("JAVA_HOME")
    if home and os.access(os.path.join(home, "bin", "javac"), os.X_OK):
        return os.path.join(home, "bin", "javac")
    return shutil.which("javac")


def pyspark_jars() -> Path | None:
    """The `jars/` directory of the installed pyspark (the classpath to compile against)."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        return None
    d = Path(spec.origin).parent / "jars"
    return d if d.is_dir() else None


def jar_path() -> Path | None:
    """The built jar, None when it has not been built."""
    return JAR if JAR.is_file() else None


def up_to_date() -> bool:
    """True when the jar exists and is newer than every source."""
    if not JAR.is_file():
        return False
    built = JAR.stat().st_mtime
    return all(p.stat().st_mtime <= built for p in sources())


def build(force: bool = False) -> Path | None:
    """Build the jar when a source is newer (or `force`); None (and nothing built) without `javac`.

    Raises `BuildError` when the compiler or `jar` fails, so a broken source never goes unnoticed.
    """
    if not force and up_to_date():
        return JAR
    jc = javac()
    jars = pyspark_jars()
    if jc is None or jars is None:
        return None
    jar_tool = os.path.join(os.path.dirname(jc), "jar")
    if not os.access(jar_tool, os.X_OK):
        jar_tool = shutil.which("jar") or ""
    if not jar_tool:
        return None
    java_files = [str(p) for p in sources() if p.suffix == ".java"]
    with tempfile.TemporaryDirectory(prefix="rmq-jvm-") as out:
        r = subprocess.run([jc, "--release", "17", "-encoding", "UTF-8", "-cp", f"{jars}/*", "-d", out,
                            *java_files], capture_output=True, text=True)
        if r.returncode != 0:
            raise BuildError(f"javac failed:\n{r.stderr}")
        shutil.copytree(SOURCE_DIR / "META-INF", Path(out) / "META-INF")
        JAR.parent.mkdir(parents=True, exist_ok=True)
        tmp = JAR.with_name(f".{JAR.name}.{os.getpid()}")
        r = subprocess.run([jar_tool, "--create", "--file", str(tmp), "-C", out, "."], capture_output=True,
                           text=True)
        if r.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise BuildError(f"jar failed:\n{r.stderr}")
        os.replace(tmp, JAR)
    return JAR


def main(argv: list[str]) -> int:
    """`build`: build the jar if needed, or say why it was skipped (exit 0 either way, 1 on a failed build)."""
    if argv[:1] != ["build"]:
        print("usage: python -m rmq_eventstore.spark.jvm build", file=sys.stderr)
        return 2
    try:
        jar = build()
    except BuildError as e:
        print(e, file=sys.stderr)
        return 1
    if jar is None:
        print("spark-jar: no javac (JDK 17) or no pyspark found: skipping the JVM reader; "
              'format("rocketmq") (the Python source) is used', file=sys.stderr)
    else:
        print(f"spark-jar: {jar}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
