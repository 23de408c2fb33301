"""``python -m cudashim [options] script.py args...``"""

from .cli import run_main

if __name__ == "__main__":
    run_main()
