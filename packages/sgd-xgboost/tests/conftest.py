"""Data shared by sgd-xgboost's tests: scikit-learn's bundled datasets (no network)."""

import numpy as np
import pandas as pd
import pytest


@pytest.fixture(scope="session")
def cancer():
    """Breast cancer (569 rows, 30 continuous features, binary): a train and a test DataFrame."""
    from sklearn.datasets import load_breast_cancer
    from sklearn.model_selection import train_test_split

    x, y = load_breast_cancer(return_X_y=True, as_frame=True)
    train, test = train_test_split(x.assign(target=y), test_size=0.25, random_state=0)
    return train.reset_index(drop=True), test.reset_index(drop=True)


@pytest.fixture(scope="session")
def digits():
    """Digits (1797 rows, 64 integer features 0-16, 10 classes) as one DataFrame."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    frame = pd.DataFrame(x.astype(np.float32), columns=[f"p{i}" for i in range(x.shape[1])])
    return frame.assign(target=y.astype(np.int64))


@pytest.fixture
def parquet_parts(tmp_path):
    """Writes a DataFrame as ``parts`` parquet files; returns their folder."""
    def write(frame, parts=4):
        folder = tmp_path / "parquet"
        folder.mkdir()
        for i, chunk in enumerate(np.array_split(np.arange(len(frame)), parts)):
            frame.iloc[chunk].to_parquet(folder / f"part_{i}.parquet")
        return str(folder)

    return write
