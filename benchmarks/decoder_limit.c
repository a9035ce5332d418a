// The decoder's limit, for benchmarks/decoder_limit.py: per-image CPU time of libjpeg-turbo on
// JPEGs held in memory, two ways: entropy decoding only (jpeg_read_coefficients: the Huffman
// decoder, nothing after it) and a whole decode to RGB (IDCT, upsampling, colour conversion).
//
//   decoder_limit ROUNDS FILE...   prints "<entropy us> <decode us>": medians over ROUNDS of the
//                                  mean over the files, CPU time of this thread.
#include <stddef.h>
#include <stdio.h>  // before jpeglib.h, which uses size_t and FILE without including them
#include <stdlib.h>
#include <time.h>

#include <jpeglib.h>

static double thread_cpu_seconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int by_value(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: decoder_limit ROUNDS FILE...\n");
    return 2;
  }
  const int rounds = atoi(argv[1]), n = argc - 2;
  unsigned char** data = malloc(sizeof *data * n);
  unsigned long* size = malloc(sizeof *size * n);
  for (int i = 0; i < n; i++) {
    FILE* f = fopen(argv[i + 2], "rb");
    if (!f || fseek(f, 0, SEEK_END) != 0) return 1;
    size[i] = (unsigned long)ftell(f);
    rewind(f);
    data[i] = malloc(size[i]);
    if (fread(data[i], 1, size[i], f) != size[i]) return 1;
    fclose(f);
  }
  struct jpeg_decompress_struct cinfo;
  struct jpeg_error_mgr err;
  cinfo.err = jpeg_std_error(&err);  // a file libjpeg refuses ends the run: these are our crops
  jpeg_create_decompress(&cinfo);
  // Rows read 16 at a time, the most one call returns (an MCU row at 4:2:0), as ImageDecoder does.
  enum { kRows = 16 };
  JSAMPROW rows[kRows];
  for (int r = 0; r < kRows; r++) rows[r] = malloc(3 * 65536);
  double* entropy = malloc(sizeof *entropy * rounds);
  double* decode = malloc(sizeof *decode * rounds);
  for (int r = 0; r < rounds; r++) {
    const double t0 = thread_cpu_seconds();
    for (int i = 0; i < n; i++) {
      jpeg_mem_src(&cinfo, data[i], size[i]);
      jpeg_read_header(&cinfo, TRUE);
      jpeg_read_coefficients(&cinfo);
      jpeg_finish_decompress(&cinfo);
    }
    const double t1 = thread_cpu_seconds();
    for (int i = 0; i < n; i++) {
      jpeg_mem_src(&cinfo, data[i], size[i]);
      jpeg_read_header(&cinfo, TRUE);
      cinfo.out_color_space = JCS_RGB;
      jpeg_start_decompress(&cinfo);
      while (cinfo.output_scanline < cinfo.output_height) jpeg_read_scanlines(&cinfo, rows, kRows);
      jpeg_finish_decompress(&cinfo);
    }
    const double t2 = thread_cpu_seconds();
    entropy[r] = (t1 - t0) / n * 1e6;
    decode[r] = (t2 - t1) / n * 1e6;
  }
  qsort(entropy, rounds, sizeof *entropy, by_value);
  qsort(decode, rounds, sizeof *decode, by_value);
  printf("%.1f %.1f\n", entropy[rounds / 2], decode[rounds / 2]);
  return 0;
}
