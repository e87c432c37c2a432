"""`make run`: the whole stack on embedded defaults — the shop's web server, a Celery worker with beat, and the
store's broker process (started by whichever of them needs the store first). Ctrl-C stops the web server and
the worker; the broker exits by itself five minutes after its last client."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main() -> int:
    port = os.environ.get("SHOP_PORT", "8000")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), str(REPO / "celery_app"), str(REPO),
                                                       os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
               DJANGO_SETTINGS_MODULE="shop.settings")
    py = sys.executable
    signal.signal(signal.SIGTERM, _interrupt)  # SIGTERM stops the stack as Ctrl-C does
    subprocess.run([py, str(HERE / "manage.py"), "migrate", "--noinput", "-v", "0"], env=env, check=True)
    subprocess.run([py, str(HERE / "manage.py"), "demo_admin"], env=env, check=True)
    var = Path(os.environ.get("SHOP_VAR", REPO / "var"))
    worker = subprocess.Popen([py, "-m", "celery", "-A", "shopcelery", "worker", "-B", "-l", "INFO",
                               "--concurrency", "2", "-n", "shop@%h"], cwd=REPO / "celery_app", env=env)
    web = subprocess.Popen([py, str(HERE / "manage.py"), "runserver", f"127.0.0.1:{port}"], env=env)
    print(f"""
  shop        http://127.0.0.1:{port}/            (orders, pages and /api/orders/)
  admin       http://127.0.0.1:{port}/admin/      admin / admin; the store's dashboard under Event store
  store       {var / 'store'}                     (its broker: {var / 'store' / 'logs' / 'broker.log'})
  database    {var / 'shop.sqlite3'}
  worker      Celery with beat, event handlers keeping the read models (customer stats, daily sales)
  Ctrl-C stops the web server and the worker.
""", flush=True)
    try:
        while web.poll() is None and worker.poll() is None:
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        for p in (web, worker):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in (web, worker):
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
