"""AIO tuning: search space, executors (fio, DeepSpeed aio, training steps),
journal with resume, search and recommendation."""
