// Where sandboxes' images come from, under every driver: a name's manifest,
// and a file of the image's EROFS content that the kernel can mount (the
// container kind's overlay lower layer) or a VM can map (its image device).
// Today the node's own store is the one source (ImageStore: the whole file
// in <data>/images, registered before use); a lazy source that fetches
// blocks when first read fits behind the same two calls. Thread-safe;
// blocking (call it off the actor threads).
#pragma once

#include <string>

#include "dsec/status.hpp"
#include "dsec/v1/types.pb.h"

namespace dsec::images {

class ImageSource {
 public:
  virtual ~ImageSource() = default;
  // The manifest of image `name`; NotFound saying how to list images.
  virtual Result<v1::ImageManifest> Get(const std::string& name) const = 0;
  // A path to `image`'s EROFS file, ready to mount or map; Unavailable
  // naming the image when its content cannot be had now.
  virtual Result<std::string> Open(const v1::ImageManifest& image) const = 0;
};

}  // namespace dsec::images
