"""tf.data: TFRecords (the JPEG bytes as they are, and the label) read by the input pipeline of
TensorFlow's ResNet-50 ImageNet recipe (tensorflow/models, imagenet_preprocessing.py and
official/vision's classification input).

train: tf.image.sample_distorted_bounding_box (area 0.08-1, aspect 3/4-4/3, 10 attempts) on the
JPEG's header, tf.image.decode_and_crop_jpeg (only the crop window is decoded), resize to 224x224
(bilinear), random left-right flip; eval: decode, resize the shorter side to 256 (aspect kept),
central crop 224. Records are shuffled (a buffer of 10,000, reshuffled each epoch, and the shard
order) for train and read in order for eval; batch(batch_size) keeps the last short batch.

TensorFlow is held to job.threads: its inter- and intra-op pools, and the dataset's private
thread pool; the map runs job.threads calls at once (--option parallel=autotune lets tf.data's
autotuner choose, within the same pool).
"""

from __future__ import annotations

import _common

ENV = {"pip": ["tensorflow-cpu==2.21.0"]}

SHARDS = 4
SHUFFLE_BUFFER = 10_000  # imagenet_preprocessing's _SHUFFLE_BUFFER

NOTES = (
    "TFRecords of the JPEG bytes, 4 shards. train: TF's crop sampling, not torchvision's: "
    "sample_distorted_bounding_box draws the aspect ratio uniformly (torchvision: log-uniform) and "
    "then the crop height uniformly between the heights that give the area range (torchvision: the "
    "area uniformly), and after 10 failed attempts takes the whole image (torchvision: a center "
    "crop clamped to the ratio range); decode_and_crop_jpeg decodes only the crop window. Resizes "
    "are tf.image.resize bilinear without antialiasing (torchvision/PIL antialias when shrinking), "
    "in float32, rounded and saturate-cast to uint8. eval: shorter side to 256 by "
    "int(side * 256 / shorter) like torchvision, central crop offset floor((h - 224) / 2) "
    "(torchvision rounds). Order: shuffle buffer of 10,000 records, not a full permutation."
)


def _shards(job):
    folder = job.work / job.key
    return folder, [folder / f"part-{i:02d}.tfrecord" for i in range(SHARDS)]


def _configure_threads(job):
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # no start-up banner
    import tensorflow as tf

    tf.config.threading.set_inter_op_parallelism_threads(job.threads)
    tf.config.threading.set_intra_op_parallelism_threads(job.threads)
    return tf


def prepare(job):
    """One record per listed sample (a repeated file is written again), the list cut into SHARDS
    consecutive runs, so that reading the shards in order gives the listed order."""
    folder, shards = _shards(job)
    done = folder / "done"
    if done.exists():
        return
    tf = _configure_threads(job)
    folder.mkdir(parents=True, exist_ok=True)
    writers = [tf.io.TFRecordWriter(str(p)) for p in shards]
    per_shard = -(-len(job.files) // SHARDS)
    for i, (path, label) in enumerate(job.files):
        with open(path, "rb") as f:
            data = f.read()
        features = tf.train.Features(
            feature={
                "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[data])),
                "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
            }
        )
        writers[i // per_shard].write(tf.train.Example(features=features).SerializeToString())
    for w in writers:
        w.close()
    done.write_text(f"{len(job.files)}\n")


def make_epoch(job):
    tf = _configure_threads(job)
    size, resize_min = job.size, job.resize
    _, shards = _shards(job)
    feature_map = {
        "image/encoded": tf.io.FixedLenFeature([], tf.string),
        "image/class/label": tf.io.FixedLenFeature([], tf.int64),
    }

    def to_uint8(image):
        return tf.saturate_cast(tf.round(image), tf.uint8)

    def train_image(buffer):
        # official/vision preprocess_ops.random_crop_image_v2, then resize and flip
        shape = tf.image.extract_jpeg_shape(buffer)
        begin, crop, _ = tf.image.sample_distorted_bounding_box(
            shape,
            bounding_boxes=tf.constant([0.0, 0.0, 1.0, 1.0], tf.float32, [1, 1, 4]),
            min_object_covered=0.08,
            aspect_ratio_range=(3.0 / 4.0, 4.0 / 3.0),
            area_range=(0.08, 1.0),
            max_attempts=10,
            use_image_if_no_bounding_boxes=True,
        )
        offset_y, offset_x, _ = tf.unstack(begin)
        height, width, _ = tf.unstack(crop)
        window = tf.stack([offset_y, offset_x, height, width])
        image = tf.image.decode_and_crop_jpeg(buffer, window, channels=3)
        image = tf.image.resize(image, [size, size], method=tf.image.ResizeMethod.BILINEAR)
        image = tf.image.random_flip_left_right(image)
        return to_uint8(image)

    def eval_image(buffer):
        # imagenet_preprocessing: decode, _aspect_preserving_resize, _central_crop
        image = tf.io.decode_jpeg(buffer, channels=3)
        shape = tf.shape(image)
        height, width = shape[0], shape[1]
        shorter = tf.minimum(height, width)
        # torchvision's int(size * long / short), in integers to avoid float rounding
        new_height = tf.where(height <= width, resize_min, height * resize_min // shorter)
        new_width = tf.where(height <= width, width * resize_min // shorter, resize_min)
        image = tf.image.resize(image, [new_height, new_width], method="bilinear")
        top = (new_height - size) // 2
        left = (new_width - size) // 2
        image = tf.slice(image, [top, left, 0], [size, size, 3])
        return to_uint8(image)

    preprocess = train_image if job.train else eval_image

    def parse(record):
        parsed = tf.io.parse_single_example(record, feature_map)
        return preprocess(parsed["image/encoded"]), parsed["image/class/label"]

    parallel = tf.data.AUTOTUNE if job.options.get("parallel") == "autotune" else job.threads
    files = [str(p) for p in shards]
    if job.train:
        dataset = tf.data.Dataset.from_tensor_slices(files).shuffle(len(files))
        dataset = dataset.interleave(
            tf.data.TFRecordDataset, cycle_length=SHARDS, num_parallel_calls=job.threads
        )
        dataset = dataset.shuffle(SHUFFLE_BUFFER, reshuffle_each_iteration=True)
    else:
        dataset = tf.data.TFRecordDataset(files)
    dataset = dataset.map(parse, num_parallel_calls=parallel, deterministic=not job.train)
    dataset = dataset.batch(job.batch_size, drop_remainder=False)
    dataset = dataset.prefetch(tf.data.AUTOTUNE)
    options = tf.data.Options()
    options.threading.private_threadpool_size = job.threads
    options.threading.max_intra_op_parallelism = 1
    options.autotune.cpu_budget = job.threads
    dataset = dataset.with_options(options)
    return lambda: dataset.as_numpy_iterator()


def version():
    import tensorflow as tf

    return f"tensorflow {tf.__version__}"


if __name__ == "__main__":
    raise SystemExit(
        _common.main("tf.data", make_epoch, version=version, prepare=prepare, notes=NOTES)
    )
