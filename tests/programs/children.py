"""Starts every kind of child Python; each reports, from inside, whether it is shimmed."""

import concurrent.futures
import multiprocessing
import subprocess
import sys

import torch
import torch.multiprocessing as torch_mp
from torch.utils.data import DataLoader, Dataset


def probe(_=None):
    """Runs in the child: True when CUDA code works there."""
    import torch
    return bool(torch.cuda.is_available() and torch.ones(1, device="cuda").is_cuda)


def spawn_target(index, queue):
    queue.put(("torch.multiprocessing.spawn", probe()))


class ProbeDataset(Dataset):
    def __len__(self):
        return 2

    def __getitem__(self, index):
        return torch.tensor(probe())


def main():
    results = {}
    for method in ("spawn", "forkserver"):
        with multiprocessing.get_context(method).Pool(1) as pool:
            results[f"multiprocessing {method}"] = pool.apply(probe)
        loader = DataLoader(ProbeDataset(), num_workers=2, multiprocessing_context=method)
        results[f"DataLoader workers ({method})"] = all(bool(b) for b in loader)
    loader = DataLoader(ProbeDataset(), num_workers=2, multiprocessing_context="fork")
    results["DataLoader workers (fork)"] = all(bool(b) for b in loader)
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        results["concurrent.futures (spawn)"] = pool.submit(probe).result()
    queue = torch_mp.get_context("spawn").SimpleQueue()
    torch_mp.spawn(spawn_target, args=(queue,), nprocs=1, join=True)
    name, answer = queue.get()
    results[name] = answer
    code = "import torch; print(torch.cuda.is_available() and torch.ones(1).cuda().is_cuda)"
    results["subprocess"] = subprocess.run([sys.executable, "-c", code], capture_output=True,
                                           text=True, check=True).stdout.strip() == "True"
    for name, answer in results.items():
        print(f"{name}: {answer}")


if __name__ == "__main__":
    main()
