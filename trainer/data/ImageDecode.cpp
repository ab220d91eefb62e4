#include "trainer/data/ImageDecode.h"

// jpeglib.h needs FILE and size_t declared first.
#include <jerror.h>
#include <jpeglib.h>
#include <png.h>

#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <vector>

#include "core/Error.h"

namespace cairn {
namespace {

constexpr uint32_t kMaxSide = 16384;

std::vector<uint8_t> readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) CAIRN_THROW(BadInput, path, ": cannot open");
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)),
                              std::istreambuf_iterator<char>());
}

// Pillow's RGB -> L.
void rgbToGray(const uint8_t* rgb, uint8_t* gray, size_t pixels) {
  for (size_t i = 0; i < pixels; ++i, rgb += 3)
    gray[i] = uint8_t((rgb[0] * 19595u + rgb[1] * 38470u + rgb[2] * 7471u + 0x8000u) >> 16);
}

// Interleaved (H, W, C) rows -> (C, H, W); RGB pixels become gray when one channel is asked for.
torch::Tensor toTensor(std::vector<uint8_t>& pixels, uint32_t height, uint32_t width,
                       int decoded_channels, int64_t channels) {
  const size_t count = size_t(height) * width;
  if (decoded_channels == 3 && channels == 1) {
    std::vector<uint8_t> gray(count);
    rgbToGray(pixels.data(), gray.data(), count);
    pixels.swap(gray);
    decoded_channels = 1;
  }
  torch::Tensor hwc = torch::from_blob(
      pixels.data(), {int64_t(height), int64_t(width), int64_t(decoded_channels)}, torch::kUInt8);
  // clone, not contiguous(): with one channel the permuted view already counts as contiguous and
  // would keep pointing into `pixels`.
  return hwc.permute({2, 0, 1}).clone(at::MemoryFormat::Contiguous);
}

// ---- PNG ---------------------------------------------------------------------------------------

struct PngSource {
  const std::vector<uint8_t>* bytes;
  size_t offset;
  char message[256];
};

void pngError(png_structp png, png_const_charp message) {
  auto* source = static_cast<PngSource*>(png_get_error_ptr(png));
  std::snprintf(source->message, sizeof source->message, "%s", message);
  png_longjmp(png, 1);
}
void pngWarning(png_structp, png_const_charp) {}  // benign (e.g. unknown chunks); errors throw

void pngRead(png_structp png, png_bytep out, png_size_t length) {
  auto* source = static_cast<PngSource*>(png_get_io_ptr(png));
  if (source->bytes->size() - source->offset < length) png_error(png, "the file is truncated");
  std::memcpy(out, source->bytes->data() + source->offset, length);
  source->offset += length;
}

// All non-trivial objects live in the caller: libpng returns here by longjmp.
bool decodePng(PngSource* source, std::vector<uint8_t>* pixels, uint32_t* height, uint32_t* width,
               int* decoded_channels, bool want_rgb) {
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, source, pngError, pngWarning);
  if (!png) return false;
  png_infop info = png_create_info_struct(png);
  std::vector<png_bytep>* volatile rows = nullptr;  // volatile: read after a longjmp
  if (setjmp(png_jmpbuf(png))) {
    delete rows;
    png_destroy_read_struct(&png, &info, nullptr);
    return false;
  }
  if (!info) png_error(png, "out of memory");
  png_set_read_fn(png, source, pngRead);
  png_read_info(png, info);
  *width = png_get_image_width(png, info);
  *height = png_get_image_height(png, info);
  if (*width > kMaxSide || *height > kMaxSide) png_error(png, "image larger than 16384 pixels");
  const int color = png_get_color_type(png, info);
  if (color == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (color == PNG_COLOR_TYPE_GRAY && png_get_bit_depth(png, info) < 8)
    png_set_expand_gray_1_2_4_to_8(png);
  if (png_get_bit_depth(png, info) == 16) png_set_strip_16(png);
  // Expanding a palette also turns a tRNS chunk into alpha; Pillow's convert drops it either way.
  if ((color & PNG_COLOR_MASK_ALPHA) || png_get_valid(png, info, PNG_INFO_tRNS))
    png_set_strip_alpha(png);
  const bool gray = color == PNG_COLOR_TYPE_GRAY || color == PNG_COLOR_TYPE_GRAY_ALPHA;
  if (gray && want_rgb) png_set_gray_to_rgb(png);
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  *decoded_channels = png_get_channels(png, info);
  const size_t stride = png_get_rowbytes(png, info);
  if (stride != size_t(*width) * size_t(*decoded_channels))
    png_error(png, "unexpected row layout after conversion");
  pixels->resize(stride * *height);
  rows = new std::vector<png_bytep>(*height);
  for (uint32_t y = 0; y < *height; ++y) (*rows)[y] = pixels->data() + y * stride;
  png_read_image(png, rows->data());
  png_read_end(png, nullptr);
  delete rows;
  png_destroy_read_struct(&png, &info, nullptr);
  return true;
}

// ---- JPEG --------------------------------------------------------------------------------------

struct JpegErrors {
  jpeg_error_mgr manager;
  jmp_buf jump;
  bool truncated;
  char message[JMSG_LENGTH_MAX];
};

void jpegError(j_common_ptr cinfo) {
  auto* errors = reinterpret_cast<JpegErrors*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, errors->message);
  longjmp(errors->jump, 1);
}

void jpegMessage(j_common_ptr cinfo, int level) {
  auto* errors = reinterpret_cast<JpegErrors*>(cinfo->err);
  // Pillow refuses truncated JPEGs; libjpeg only warns and fills the rest with grey.
  if (level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF) errors->truncated = true;
  if (level < 0) ++cinfo->err->num_warnings;
}

bool decodeJpeg(const std::vector<uint8_t>& bytes, JpegErrors* errors, std::vector<uint8_t>* pixels,
                uint32_t* height, uint32_t* width, int* decoded_channels, bool want_rgb) {
  jpeg_decompress_struct cinfo;
  cinfo.err = jpeg_std_error(&errors->manager);
  errors->manager.error_exit = jpegError;
  errors->manager.emit_message = jpegMessage;
  errors->truncated = false;
  if (setjmp(errors->jump)) {
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, bytes.data(), static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&cinfo, TRUE);
  if (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK) {
    std::snprintf(errors->message, sizeof errors->message, "CMYK JPEGs are not read");
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  const bool gray = cinfo.jpeg_color_space == JCS_GRAYSCALE;
  // A colour JPEG asked for in gray is decoded to RGB and converted as Pillow does.
  cinfo.out_color_space = gray && !want_rgb ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_start_decompress(&cinfo);
  *width = cinfo.output_width;
  *height = cinfo.output_height;
  *decoded_channels = cinfo.output_components;
  if (*width > kMaxSide || *height > kMaxSide) {
    std::snprintf(errors->message, sizeof errors->message, "image larger than 16384 pixels");
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  const size_t stride = size_t(*width) * size_t(*decoded_channels);
  pixels->resize(stride * *height);
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = pixels->data() + size_t(cinfo.output_scanline) * stride;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  if (errors->truncated) {
    std::snprintf(errors->message, sizeof errors->message, "the file is truncated");
    return false;
  }
  return true;
}

}  // namespace

torch::Tensor decodeImageFile(const std::string& path, int64_t channels) {
  std::vector<uint8_t> bytes = readFile(path);
  std::vector<uint8_t> pixels;
  uint32_t height = 0, width = 0;
  int decoded = 0;
  static const uint8_t kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (bytes.size() >= 8 && std::memcmp(bytes.data(), kPng, 8) == 0) {
    PngSource source{&bytes, 0, {}};
    if (!decodePng(&source, &pixels, &height, &width, &decoded, channels == 3))
      CAIRN_THROW(BadInput, path, ": cannot decode the PNG: ",
                  source.message[0] ? source.message : "out of memory");
  } else if (bytes.size() >= 3 && bytes[0] == 0xFF && bytes[1] == 0xD8 && bytes[2] == 0xFF) {
    JpegErrors errors{};
    if (!decodeJpeg(bytes, &errors, &pixels, &height, &width, &decoded, channels == 3))
      CAIRN_THROW(BadInput, path, ": cannot decode the JPEG: ", errors.message);
  } else {
    CAIRN_THROW(BadInput, path, ": not a PNG or JPEG file (by its first bytes)");
  }
  if (height == 0 || width == 0) CAIRN_THROW(BadInput, path, ": the image is empty");
  return toTensor(pixels, height, width, decoded, channels);
}

}  // namespace cairn
