#include "actors/image_worker.hpp"

#include "actors/context.hpp"
#include "drivers/images/image_store.hpp"
#include "dsec/status_proto.hpp"

namespace dsec {

namespace {

v1::ImageReply Reply(const Status& st, v1::ImageManifest m = {}) {
  v1::ImageReply r;
  ToProto(st, r.mutable_status());
  *r.mutable_image() = std::move(m);
  return r;
}

image_worker_actor::behavior_type ImageWorker(image_worker_actor::pointer self, std::shared_ptr<NodeContext> ctx) {
  auto store = std::make_shared<images::ImageStore>(ctx->store, ctx->options.image_root);
  return {
      [store, ctx](const v1::RegisterImageRequest& req) {
        Status st = store->Register(req.manifest(), req.replace());
        if (st.ok()) ctx->log->info("image {} registered ({}, {} bytes)", req.manifest().name(),
                                    req.manifest().digest(), req.manifest().size_bytes());
        return Reply(st, req.manifest());
      },
      [store](const v1::GetImageRequest& req) {
        auto m = store->Get(req.name());
        return m.ok() ? Reply(Status::Ok(), *m) : Reply(m.status());
      },
      [store](const v1::ListImagesRequest&) {
        v1::ImagesReply r;
        auto all = store->List();
        if (!all.ok()) ToProto(all.status(), r.mutable_status());
        else
          for (auto& m : *all) *r.add_images() = std::move(m);
        return r;
      },
      [store, ctx](const v1::RemoveImageRequest& req) {
        auto m = store->Get(req.name());
        Status st = m.ok() ? store->Remove(req.name()) : m.status();
        if (st.ok()) ctx->log->info("image {} removed", req.name());
        return m.ok() ? Reply(st, *m) : Reply(st);
      },
  };
}

}  // namespace

image_worker_actor SpawnImageWorker(caf::local_actor* parent, std::shared_ptr<NodeContext> ctx) {
  return parent->spawn<caf::detached>(ImageWorker, std::move(ctx));
}

}  // namespace dsec
